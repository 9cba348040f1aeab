"""Reads a PyTorch checkpoint (`torch.save`'s zip format) into NumPy arrays, without PyTorch.

A `torch.save` file is a zip archive: `<prefix>/data.pkl` (a pickle of the saved object, whose
tensors refer to storages by key) and `<prefix>/data/<key>` (each storage's raw little-endian
bytes). The pickle is read with an allow-list, like `torch.load(weights_only=True)`: dicts, lists,
numbers, strings, OrderedDict and tensors are rebuilt; any other class (which a pickle could use to
run code) is refused with an InputError. Tensors come back as C-contiguous NumPy arrays.

The legacy (pre-1.6, non-zip) format is not read: re-save such a file with a current PyTorch.
"""

from __future__ import annotations

import collections
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from jepa_cli.errors import InputError

# torch's typed storage classes (pickled as globals `torch.<Name>`) -> their element dtype
_STORAGE_DTYPES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
    "BFloat16Storage": "bfloat16", "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16,
    "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_, "UntypedStorage": np.uint8,
}


class _Storage:
    def __init__(self, data: np.ndarray):
        self.data = data  # 1-D array of the storage's elements


def _rebuild_tensor(storage: _Storage, offset: int, size, stride, *_ignored) -> np.ndarray:
    """torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, hooks[, meta])."""
    data = storage.data
    if len(size) == 0:
        return np.array(data[offset])
    last = offset + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else offset
    if all(size) and last >= data.size:
        raise ValueError("a tensor reaches past the end of its storage")
    view = np.lib.stride_tricks.as_strided(data[offset:], shape=tuple(size),
                                           strides=tuple(s * data.itemsize for s in stride))
    return np.array(view)  # a copy: contiguous and independent of the archive's buffer


def _rebuild_parameter(data, *_ignored):
    """torch._utils._rebuild_parameter(data, requires_grad, backward_hooks): the tensor itself."""
    return data


_ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
}


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

        class Unpickler(pickle.Unpickler):
            def find_class(self, module: str, name: str):
                if (module, name) in _ALLOWED:
                    return _ALLOWED[(module, name)]
                if module == "torch" and name in _STORAGE_DTYPES:
                    return name
                raise InputError(f"{path}: holds a {module}.{name} object, not only tensors and plain data "
                                 "(refusing to unpickle it: a checkpoint never needs that)")

            def persistent_load(self, pid):
                if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
                    raise InputError(f"{path}: unexpected persistent id {pid!r} in data.pkl")
                _, kind, key, _location, numel = pid[:5]
                if key not in storages:
                    raw = archive.read(f"{prefix}data/{key}")
                    dtype = np.dtype(_dtype(_STORAGE_DTYPES.get(kind, kind)))
                    if len(raw) < numel * dtype.itemsize:
                        raise ValueError(f"storage {key} is shorter than its {numel} elements")
                    storages[key] = _Storage(np.frombuffer(raw, dtype=dtype, count=numel))
                return storages[key]

        try:
            with archive.open(pickles[0]) as f:
                return Unpickler(f).load()
        except InputError:
            raise
        except (pickle.UnpicklingError, EOFError, KeyError, ValueError, TypeError, zipfile.BadZipFile,
                OSError) as exc:
            raise InputError(f"{path}: damaged PyTorch checkpoint ({type(exc).__name__}: {exc})") from None
