"""Reads a PyTorch checkpoint (`torch.save`'s zip format) into NumPy arrays, without PyTorch.

A `torch.save` file is a zip archive: `<prefix>/data.pkl` (a pickle of the saved object, whose
tensors refer to storages by key) and `<prefix>/data/<key>` (each storage's raw little-endian
bytes). The pickle is read with an allow-list, like `torch.load(weights_only=True)`: dicts, lists,
numbers, strings, OrderedDict and tensors are rebuilt; any other class (which a pickle could use to
run code) is refused with an InputError. Tensors come back as C-contiguous NumPy arrays.

Nothing in the file is trusted to fit: each tensor's storage offset, sizes and strides are checked
against its storage's element count before a view is taken (a bad one would read, or crash on,
memory outside the storage), each storage against its bytes in the archive, and every storage and
tensor against the memory left before it is allocated. Any of these is an InputError naming the file.

The legacy (pre-1.6, non-zip) format is not read: re-save such a file with a current PyTorch.
"""

from __future__ import annotations

import collections
import math
import pickle
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jepa_cli.data.resources import available_memory, format_bytes
from jepa_cli.errors import InputError

# torch's typed storage classes (pickled as globals `torch.<Name>`) -> their element dtype
_STORAGE_DTYPES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
    "BFloat16Storage": "bfloat16", "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16,
    "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_, "UntypedStorage": np.uint8,
}


class _Storage:
    def __init__(self, key: str, data: np.ndarray):
        self.key = key  # the storage's file name under <prefix>/data/
        self.data = data  # 1-D array of the storage's elements


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
    numel = storage.data.size
    if 0 in size:
        if offset > numel:
            raise ValueError(f"{where} starts at element {offset}, past the end of its {numel} elements")
        return offset, size, stride
    last = offset + sum((n - 1) * s for n, s in zip(size, stride))
    if last >= numel:
        raise ValueError(f"{where} reaches element {last}, past the end of its {numel} elements "
                         f"(offset {offset}, size {list(size)}, stride {list(stride)})")
    return offset, size, stride


def _rebuilder(budget: _Budget) -> Callable[..., np.ndarray]:
    """torch._utils._rebuild_tensor_v2 for one read, charging each tensor's bytes to `budget`."""

    def rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_ignored) -> np.ndarray:
        """_rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, hooks[, meta])."""
        if not isinstance(storage, _Storage):
            raise ValueError(f"a tensor refers to a {type(storage).__name__}, not to a storage")
        offset, size, stride = _check_view(storage, offset, size, stride)
        data = storage.data
        budget.charge(math.prod(size) * data.itemsize, f"a tensor of size {list(size)} on storage {storage.key}")
        if 0 in size:
            return np.zeros(size, data.dtype)
        view = np.lib.stride_tricks.as_strided(data[offset:], shape=size,
                                               strides=tuple(s * data.itemsize for s in stride))
        return np.array(view)  # a copy: contiguous and independent of the archive's buffer

    return rebuild_tensor


def _rebuild_parameter(data, *_ignored):
    """torch._utils._rebuild_parameter(data, requires_grad, backward_hooks): the tensor itself."""
    return data


_ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
}  # and ("torch._utils", "_rebuild_tensor_v2"): a _rebuilder per read


def _dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes  # a JAX dependency

        return ml_dtypes.bfloat16
    return name


def read_torch_checkpoint(path: str | Path) -> Any:
    """The object a `torch.save` file holds, with every tensor as a NumPy array.

    InputError (one line, naming the file) for a missing, truncated or non-zip file, a legacy-format
    file, and a pickle that needs a class outside the allow-list."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such checkpoint file")
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise InputError(f"{path}: not a PyTorch checkpoint in the zip format of torch.save (truncated, "
                         "another kind of file, or the pre-1.6 legacy format: re-save it with torch.save)") from None
    with archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise InputError(f"{path}: a zip file, but not one torch.save wrote (no single data.pkl)")
        prefix = pickles[0][: -len("data.pkl")]
        byteorder = prefix + "byteorder"
        if byteorder in archive.namelist() and archive.read(byteorder).strip() != b"little":
            raise InputError(f"{path}: saved on a big-endian machine, which is not supported")

        storages: dict[str, _Storage] = {}
        budget = _Budget(available_memory())
        allowed = {**_ALLOWED, ("torch._utils", "_rebuild_tensor_v2"): _rebuilder(budget)}

        class Unpickler(pickle.Unpickler):
            def find_class(self, module: str, name: str):
                if (module, name) in allowed:
                    return allowed[(module, name)]
                if module == "torch" and name in _STORAGE_DTYPES:
                    return name
                raise InputError(f"{path}: holds a {module}.{name} object, not only tensors and plain data "
                                 "(refusing to unpickle it: a checkpoint never needs that)")

            def persistent_load(self, pid):
                if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
                    raise InputError(f"{path}: unexpected persistent id {pid!r} in data.pkl")
                _, kind, key, _location, numel = pid[:5]
                if not (isinstance(kind, str) and kind in _STORAGE_DTYPES and isinstance(key, str)):
                    raise ValueError(f"a storage of kind {kind!r} and key {key!r}, not a torch storage")
                if key not in storages:
                    dtype = np.dtype(_dtype(_STORAGE_DTYPES[kind]))
                    nbytes = _count(numel, f"the element count of storage {key}") * dtype.itemsize
                    name = f"{prefix}data/{key}"
                    if archive.getinfo(name).file_size < nbytes:
                        raise ValueError(f"storage {key} is shorter than its {numel} elements")
                    budget.charge(nbytes, f"storage {key} ({numel} elements)")
                    with archive.open(name) as member:
                        raw = member.read(nbytes)
                    if len(raw) < nbytes:
                        raise ValueError(f"storage {key} is shorter than its {numel} elements")
                    storages[key] = _Storage(key, np.frombuffer(raw, dtype=dtype, count=numel))
                return storages[key]

        try:
            with archive.open(pickles[0]) as f:
                return Unpickler(f).load()
        except InputError:
            raise
        except (pickle.UnpicklingError, EOFError, KeyError, ValueError, TypeError, AttributeError, IndexError,
                OverflowError, RecursionError, MemoryError, zipfile.BadZipFile, OSError) as exc:
            raise InputError(f"{path}: damaged PyTorch checkpoint ({type(exc).__name__}: {exc})") from None
