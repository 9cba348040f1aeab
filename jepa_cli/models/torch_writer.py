"""Writes a PyTorch checkpoint (`torch.save`'s zip format) from NumPy arrays, without PyTorch.

The inverse of models/torch_checkpoint.py: a zip archive (stored, not compressed) of
`archive/data.pkl`, a protocol-2 pickle of the object whose tensors refer to storages by key,
`archive/data/<key>` (each storage's raw little-endian bytes, one per tensor, starting on a
64-byte boundary as torch aligns them), `archive/byteorder`, `archive/version`,
`archive/.format_version` and `archive/.storage_alignment`. The pickle is emitted opcode by opcode
rather than by `pickle.Pickler`, which would need the torch classes it names to be importable; it
names only what `torch.load(weights_only=True)` allows: `collections.OrderedDict`,
`torch._utils._rebuild_tensor_v2` and the typed storages (`torch.FloatStorage`, ...).

Objects that can be written: dict and OrderedDict (string keys), list, tuple, str, int, float,
bool, None and NumPy arrays of the dtypes torch has a storage for.
"""

from __future__ import annotations

import collections
import io
import struct
import zipfile
from typing import Any

import numpy as np

from jepa_cli.models.torch_checkpoint import STORAGE_DTYPES, numpy_dtype

ALIGNMENT = 64  # torch.save's .storage_alignment: each storage's bytes start on this boundary
ARCHIVE = "archive"  # the archive's top folder; torch.load accepts any single name
# NumPy dtype -> torch's storage class (UntypedStorage is bytes of no dtype: never written)
_STORAGES = {np.dtype(numpy_dtype(dt)): name for name, dt in STORAGE_DTYPES.items() if name != "UntypedStorage"}


class _PickleWriter:
    """The opcodes of one protocol-2 pickle; tensors become storages collected in `self.storages`."""

    def __init__(self) -> None:
        self.out = io.BytesIO()
        self.storages: list[np.ndarray] = []  # key i is self.storages[i]

    def write(self, obj: Any) -> bytes:
        self.out.write(b"\x80\x02")  # PROTO 2
        self._save(obj)
        self.out.write(b".")  # STOP
        return self.out.getvalue()

    def _global(self, module: str, name: str) -> None:
        self.out.write(b"c" + module.encode() + b"\n" + name.encode() + b"\n")  # GLOBAL

    def _save(self, obj: Any) -> None:
        w = self.out.write
        if obj is None:
            w(b"N")
        elif obj is True or obj is False:
            w(b"\x88" if obj else b"\x89")  # NEWTRUE / NEWFALSE
        elif isinstance(obj, (int, np.integer)):
            self._int(int(obj))
        elif isinstance(obj, (float, np.floating)):
            w(b"G" + struct.pack(">d", float(obj)))  # BINFLOAT
        elif isinstance(obj, str):
            raw = obj.encode("utf-8")
            w(b"X" + struct.pack("<I", len(raw)) + raw)  # BINUNICODE
        elif isinstance(obj, tuple):
            w(b"(")  # MARK
            for item in obj:
                self._save(item)
            w(b"t")  # TUPLE
        elif isinstance(obj, list):
            w(b"](")  # EMPTY_LIST, MARK
            for item in obj:
                self._save(item)
            w(b"e")  # APPENDS
        elif isinstance(obj, dict):
            if isinstance(obj, collections.OrderedDict):
                self._global("collections", "OrderedDict")
                w(b")R")  # EMPTY_TUPLE, REDUCE: OrderedDict()
            else:
                w(b"}")  # EMPTY_DICT
            w(b"(")
            for key, value in obj.items():
                if not isinstance(key, str):
                    raise TypeError(f"a dict key {key!r} is not a string")
                self._save(key)
                self._save(value)
            w(b"u")  # SETITEMS
        elif isinstance(obj, np.ndarray):
            self._tensor(obj)
        else:
            raise TypeError(f"cannot write a {type(obj).__name__} into a torch checkpoint")

    def _int(self, value: int) -> None:
        if 0 <= value < 256:
            self.out.write(b"K" + bytes([value]))  # BININT1
        elif 0 <= value < 65536:
            self.out.write(b"M" + struct.pack("<H", value))  # BININT2
        elif -2**31 <= value < 2**31:
            self.out.write(b"J" + struct.pack("<i", value))  # BININT
        else:
            raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
            self.out.write(b"\x8a" + bytes([len(raw)]) + raw)  # LONG1

    def _tensor(self, array: np.ndarray) -> None:
        """torch._utils._rebuild_tensor_v2(storage, 0, size, stride, False, OrderedDict()) of a
        C-contiguous copy of `array` on a storage of its own."""
        storage = _STORAGES.get(array.dtype)
        if storage is None:
            raise TypeError(f"torch has no storage for dtype {array.dtype}")
        array = np.ascontiguousarray(array)
        key = len(self.storages)
        self.storages.append(array)
        # C-contiguous strides in elements, from the shape (NumPy's of an empty array may be any)
        strides = tuple(int(np.prod(array.shape[i + 1:], dtype=np.int64)) for i in range(array.ndim))
        w = self.out.write
        self._global("torch._utils", "_rebuild_tensor_v2")
        w(b"(")
        w(b"(")  # the persistent id: ("storage", torch.<Storage>, key, "cpu", numel)
        self._save("storage")
        self._global("torch", storage)
        self._save(str(key))
        self._save("cpu")
        self._int(int(array.size))
        w(b"tQ")  # TUPLE, BINPERSID
        self._int(0)  # storage offset
        self._save(tuple(int(n) for n in array.shape))
        self._save(strides)
        w(b"\x89")  # requires_grad False
        self._global("collections", "OrderedDict")
        w(b")R")  # backward hooks: OrderedDict()
        w(b"tR")  # TUPLE, REDUCE


def _aligned(archive: zipfile.ZipFile, name: str, data: bytes) -> None:
    """Stores `data` as `name`, padding the local header's extra field so that the data start on
    an ALIGNMENT boundary (as torch's writer does; torch.load(mmap=True) maps storages in place)."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    start = archive.fp.tell() + 30 + len(name.encode()) + 4  # local header, name, 4-byte extra header
    pad = -start % ALIGNMENT
    info.extra = struct.pack("<HH", 0x4246, pad) + b"\0" * pad  # an "FB" padding field, as torch's
    archive.writestr(info, data)


def torch_checkpoint_bytes(obj: Any) -> bytes:
    """The bytes of a `torch.save` file holding `obj` (see the module docstring for what it may
    hold). `torch.load(weights_only=True)` reads it; so does models/torch_checkpoint.py."""
    if np.dtype("<f4") != np.dtype("=f4"):
        raise RuntimeError("writing torch checkpoints needs a little-endian machine")
    writer = _PickleWriter()
    pickled = writer.write(obj)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        _aligned(archive, f"{ARCHIVE}/data.pkl", pickled)
        _aligned(archive, f"{ARCHIVE}/.format_version", b"1")
        _aligned(archive, f"{ARCHIVE}/.storage_alignment", str(ALIGNMENT).encode())
        _aligned(archive, f"{ARCHIVE}/byteorder", b"little")
        for key, array in enumerate(writer.storages):
            _aligned(archive, f"{ARCHIVE}/data/{key}", array.tobytes())
        _aligned(archive, f"{ARCHIVE}/version", b"3\n")
    return buffer.getvalue()
