"""Reads a PyTorch checkpoint (`torch.save`'s zip format) into NumPy arrays, without PyTorch.

A `torch.save` file is a zip archive: `<prefix>/data.pkl` (a pickle of the saved object, whose
tensors refer to storages by key) and `<prefix>/data/<key>` (each storage's raw little-endian
bytes). The pickle is read with an allow-list, like `torch.load(weights_only=True)`: dicts, lists,
numbers, strings, OrderedDict and tensors are rebuilt; any other class (which a pickle could use to
run code) is refused with an InputError. Tensors come back as C-contiguous NumPy arrays.

Only what is asked for is read: `keys` names the top-level entries whose tensors are loaded; every
other tensor stays a TensorRef (its shape and dtype, no bytes read), so an optimizer's moments cost
nothing and a model's size can be told from its shapes alone. `inert=True` (for PyTorch Lightning
checkpoints, whose hyper-parameters pickle classes such as functools.partial and callbacks) keeps
each object of another class as an Inert record of its pickled arguments instead of refusing it:
no class outside the allow-list is ever imported or called, so nothing in the file runs; a
reference to a module that runs code (os, subprocess, builtins.eval, ...) is still refused.

Nothing in the file is trusted to fit: each tensor's storage offset, sizes and strides are checked
against its storage's element count before a view is taken (a bad one would read, or crash on,
memory outside the storage), each storage against its bytes in the archive, and every storage and
tensor against the memory left before it is allocated. The pickle's nesting is measured from its
opcodes before it is unpickled (models/pickle_nesting.py): unpickling hashes a dict key, and a tuple nested
hundreds of thousands deep would overflow the C stack doing so. Any of these is an InputError naming
the file.

The legacy (pre-1.6, non-zip) format is not read: re-save such a file with a current PyTorch.
"""

from __future__ import annotations

import collections
import io
import math
import pickle
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from jepa_cli.data.resources import available_memory, format_bytes
from jepa_cli.errors import InputError
from jepa_cli.models.pickle_nesting import check_nesting

# torch's typed storage classes (pickled as globals `torch.<Name>`) -> their element dtype
STORAGE_DTYPES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
    "BFloat16Storage": "bfloat16", "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16,
    "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_, "UntypedStorage": np.uint8,
}


class _Storage:
    """One storage of the archive, read on first use (`load`): a storage only unselected tensors use
    is never read."""

    def __init__(self, key: str, dtype: np.dtype, numel: int, read: Callable[[], bytes]):
        self.key = key  # the storage's file name under <prefix>/data/
        self.dtype = dtype
        self.numel = numel
        self._read = read
        self._data: np.ndarray | None = None

    def load(self, budget: "_Budget") -> np.ndarray:
        """The storage's elements as a 1-D array (read once, charged to `budget` then)."""
        if self._data is None:
            budget.charge(self.numel * self.dtype.itemsize, f"storage {self.key} ({self.numel} elements)")
            raw = self._read()
            if len(raw) < self.numel * self.dtype.itemsize:
                raise ValueError(f"storage {self.key} is shorter than its {self.numel} elements")
            self._data = np.frombuffer(raw, dtype=self.dtype, count=self.numel)
        return self._data


class TensorRef:
    """A tensor of the checkpoint that was not loaded: its shape and dtype (and, inside the reader,
    the checked view of its storage)."""

    def __init__(self, storage: _Storage, offset: int, shape: tuple[int, ...], stride: tuple[int, ...]):
        self._storage, self._offset, self._stride = storage, offset, stride
        self.shape = shape
        self.dtype = storage.dtype

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __repr__(self) -> str:
        return f"TensorRef({list(self.shape)}, {self.dtype})"

    def load(self, budget: "_Budget") -> np.ndarray:
        data = self._storage.load(budget)
        budget.charge(self.size * data.itemsize, f"a tensor of size {list(self.shape)} on storage {self._storage.key}")
        if 0 in self.shape:
            return np.zeros(self.shape, data.dtype)
        view = np.lib.stride_tricks.as_strided(data[self._offset:], shape=self.shape,
                                               strides=tuple(s * data.itemsize for s in self._stride))
        return np.array(view)  # a copy: contiguous and independent of the archive's buffer


class Inert:
    """An object of a class outside the allow-list, kept as data (inert mode): `cls` is the
    "module.name" the pickle named, `args` what it was called with, `state` what was set on it.
    Nothing of that class is imported or run."""

    cls = "?"

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls)
        obj.args, obj.kwargs, obj.state = args, kwargs, None
        return obj

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        self.state = state

    # a pickled dict or list subclass fills itself after construction: kept, as data, in `items`
    def __setitem__(self, key, value):
        self.__dict__.setdefault("items", []).append((key, value))

    def append(self, value):
        self.__dict__.setdefault("items", []).append(value)

    def extend(self, values):
        self.__dict__.setdefault("items", []).extend(values)

    def __repr__(self) -> str:
        return f"<inert {self.cls}>"


# modules and builtins a pickle reaches to run code: refused even in inert mode, so that a file
# built to run something is an error rather than a quietly inert record
_CODE_MODULES = frozenset({"os", "posix", "nt", "subprocess", "sys", "shutil", "importlib", "runpy", "socket",
                           "ctypes", "code", "codeop", "pty", "webbrowser", "pickle", "_pickle", "marshal",
                           "multiprocessing", "signal", "asyncio", "pdb", "platform", "tempfile", "io", "_io",
                           "pathlib", "commands", "popen2", "timeit", "cProfile", "profile", "trace"})
_CODE_BUILTINS = frozenset({"eval", "exec", "compile", "__import__", "open", "breakpoint", "input", "exit",
                            "quit", "help", "globals", "locals", "vars", "delattr", "setattr", "memoryview"})


def _runs_code(module: str, name: str) -> bool:
    root = module.split(".")[0]
    return root in _CODE_MODULES or (root in ("builtins", "__builtin__") and name in _CODE_BUILTINS)


class _Budget:
    """The bytes of memory one read may still fill (None: unknown, unchecked): a pickle is free to
    declare any sizes, and each storage and tensor it builds is charged here before it is allocated."""

    def __init__(self, available: int | None):
        self.left = available

    def charge(self, nbytes: int, what: str) -> None:
        if self.left is not None:
            if nbytes > self.left:
                raise ValueError(f"{what} needs {format_bytes(nbytes)}, more than the {format_bytes(self.left)} "
                                 "of memory left")
            self.left -= nbytes


def _count(value: Any, what: str) -> int:
    """`value` as a Python int >= 0 (a bool, a float or a negative number is damage, not a count)."""
    if type(value) is not int or value < 0:
        raise ValueError(f"{what} is {value!r}, not a count")
    return value


def _check_view(storage: _Storage, offset: Any, size: Any, stride: Any) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """(offset, size, stride) once they are known to address only elements inside `storage`: every
    figure a non-negative int, as many strides as sizes, and the last element addressed, computed
    with Python's unbounded ints (no overflow), before the end of the storage. NumPy's as_strided
    trusts its arguments, so anything else would read or crash on memory outside the storage."""
    where = f"a tensor on storage {storage.key}"
    if not (isinstance(size, (tuple, list)) and isinstance(stride, (tuple, list)) and len(size) == len(stride)):
        raise ValueError(f"{where} has size {size!r} and stride {stride!r}, not two tuples of one length")
    offset = _count(offset, f"the storage offset of {where}")
    size = tuple(_count(n, f"a size of {where}") for n in size)
    stride = tuple(_count(s, f"a stride of {where}") for s in stride)
    numel = storage.numel
    if 0 in size:
        if offset > numel:
            raise ValueError(f"{where} starts at element {offset}, past the end of its {numel} elements")
        return offset, size, stride
    last = offset + sum((n - 1) * s for n, s in zip(size, stride))
    if last >= numel:
        raise ValueError(f"{where} reaches element {last}, past the end of its {numel} elements "
                         f"(offset {offset}, size {list(size)}, stride {list(stride)})")
    return offset, size, stride


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_ignored) -> TensorRef:
    """torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, hooks[, meta]),
    as a checked reference: the bytes are read only if the tensor is selected."""
    if not isinstance(storage, _Storage):
        raise ValueError(f"a tensor refers to a {type(storage).__name__}, not to a storage")
    offset, size, stride = _check_view(storage, offset, size, stride)
    return TensorRef(storage, offset, size, stride)


def _rebuild_parameter(data, *_ignored):
    """torch._utils._rebuild_parameter(data, requires_grad, backward_hooks): the tensor itself."""
    return data


_ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
}


def numpy_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes  # a JAX dependency

        return ml_dtypes.bfloat16
    return name


def _materialise(obj: Any, budget: _Budget, seen: dict[int, Any]) -> Any:
    """`obj` with every TensorRef inside its dicts, lists and tuples loaded (Inert records are left
    alone: nothing is needed from them). Containers are the reader's own, so they are filled in place."""
    if isinstance(obj, TensorRef):
        return obj.load(budget)
    if id(obj) in seen:
        return seen[id(obj)]
    if isinstance(obj, dict):
        seen[id(obj)] = obj
        for k, v in obj.items():
            obj[k] = _materialise(v, budget, seen)
    elif isinstance(obj, list):
        seen[id(obj)] = obj
        obj[:] = [_materialise(v, budget, seen) for v in obj]
    elif isinstance(obj, tuple):
        seen[id(obj)] = obj
        obj = seen[id(obj)] = tuple(_materialise(v, budget, seen) for v in obj)
    return obj


def read_torch_checkpoint(path: str | Path, keys: Iterable[str] | None = None, inert: bool = False) -> Any:
    """The object a `torch.save` file holds, with the tensors under the top-level `keys` (None: all)
    as NumPy arrays and every other tensor as a TensorRef; `inert`: objects of other classes become
    Inert records (see the module docstring) instead of an error.

    InputError (one line, naming the file) for a missing, truncated or non-zip file, a legacy-format
    file, a pickle that needs a class outside the allow-list (in inert mode: one that runs code), and
    a selected key the file does not hold as a dict entry."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such checkpoint file")
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise InputError(f"{path}: not a PyTorch checkpoint in the zip format of torch.save (truncated, "
                         "another kind of file, or the pre-1.6 legacy format: re-save it with torch.save)") from None
    with archive:
        pickled = _data_pickle(archive, path)
        try:
            data = archive.read(pickled)
            check_nesting(data)
            obj = _Unpickler(io.BytesIO(data), path, archive, pickled[: -len("data.pkl")], inert).load()
            return _materialise_selected(obj, keys, path)
        except InputError:
            raise
        except (pickle.UnpicklingError, EOFError, KeyError, ValueError, TypeError, AttributeError, IndexError,
                OverflowError, RecursionError, MemoryError, zipfile.BadZipFile, OSError) as exc:
            raise InputError(f"{path}: damaged PyTorch checkpoint ({type(exc).__name__}: {exc})") from None


def _data_pickle(archive: zipfile.ZipFile, path: Path) -> str:
    """The name of the one `<prefix>/data.pkl` of a torch.save archive; InputError for an archive
    torch.save did not write, or one saved on a big-endian machine."""
    pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
    if len(pickles) != 1:
        raise InputError(f"{path}: a zip file, but not one torch.save wrote (no single data.pkl)")
    byteorder = pickles[0][: -len("data.pkl")] + "byteorder"
    if byteorder in archive.namelist() and archive.read(byteorder).strip() != b"little":
        raise InputError(f"{path}: saved on a big-endian machine, which is not supported")
    return pickles[0]


def _materialise_selected(obj: Any, keys: Iterable[str] | None, path: Path) -> Any:
    """`obj` with the tensors under its top-level `keys` (None: all) read, within the memory left."""
    budget = _Budget(available_memory())
    if keys is None:
        return _materialise(obj, budget, {})
    keys = list(keys)
    if not isinstance(obj, dict):
        raise InputError(f"{path}: holds a {type(obj).__name__}, not a dict of {', '.join(keys)}")
    for key in keys:
        if key in obj:
            obj[key] = _materialise(obj[key], budget, {})
    return obj


class _Unpickler(pickle.Unpickler):
    """The allow-list unpickler of one checkpoint's data.pkl: allowed classes are rebuilt, storages
    are read lazily from the archive's `<prefix>data/<key>` members, other classes are refused (or,
    `inert`, kept as Inert records unless they run code)."""

    def __init__(self, file: io.BytesIO, path: Path, archive: zipfile.ZipFile, prefix: str, inert: bool):
        super().__init__(file)
        self.path, self.archive, self.prefix, self.inert = path, archive, prefix, inert
        self.storages: dict[str, _Storage] = {}
        self.inert_classes: dict[tuple[str, str], type] = {}

    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == "torch" and name in STORAGE_DTYPES:
            return name
        if _runs_code(module, name):
            raise InputError(f"{self.path}: holds a call to {module}.{name}, which would run code when "
                             "unpickled (refused; nothing in the file was run)")
        if not self.inert:
            raise InputError(f"{self.path}: holds a {module}.{name} object, not only tensors and plain data "
                             "(refusing to unpickle it: a checkpoint never needs that)")
        if (module, name) not in self.inert_classes:
            self.inert_classes[(module, name)] = type(name, (Inert,), {"cls": f"{module}.{name}"})
        return self.inert_classes[(module, name)]

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            raise InputError(f"{self.path}: unexpected persistent id {pid!r} in data.pkl")
        _, kind, key, _location, numel = pid[:5]
        if not (isinstance(kind, str) and kind in STORAGE_DTYPES and isinstance(key, str)):
            raise ValueError(f"a storage of kind {kind!r} and key {key!r}, not a torch storage")
        if key not in self.storages:
            dtype = np.dtype(numpy_dtype(STORAGE_DTYPES[kind]))
            numel = _count(numel, f"the element count of storage {key}")
            name = f"{self.prefix}data/{key}"
            if self.archive.getinfo(name).file_size < numel * dtype.itemsize:
                raise ValueError(f"storage {key} is shorter than its {numel} elements")

            def read(name=name, nbytes=numel * dtype.itemsize, archive=self.archive) -> bytes:
                with archive.open(name) as member:
                    return member.read(nbytes)

            self.storages[key] = _Storage(key, dtype, numel, read)
        return self.storages[key]
