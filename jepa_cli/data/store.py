"""Zarr v3 groups on disk: atomic directory writes, TensorStore arrays, group attributes.

Every subcommand reads and writes through this module, so the on-disk contract
(docs/formats.md) lives in one place.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import uuid
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from jepa_cli import __version__
from jepa_cli.errors import InputError, raise_terminated

GROUP_METADATA = "zarr.json"
DEFAULT_CHUNK_BYTES = 4 << 20  # aim for ~4 MiB chunks along the sample axis


def check_output(path: str | os.PathLike, force: bool) -> Path:
    """Refuses an existing output unless `force`; returns the path."""
    path = Path(path)
    if path.exists() and not force:
        raise InputError(f"{path}: already exists (use --force to overwrite)")
    if not path.parent.exists():
        raise InputError(f"{path.parent}: output directory does not exist")
    return path


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """Yields a temporary sibling of `path`; renames it into place only if the block succeeds.

    An exception, SIGINT or SIGTERM inside the block removes the temporary directory, so a
    failed or interrupted write never leaves `path` behind (nor damages an existing one).
    """
    final = check_output(path, force)
    tmp = final.with_name(f".{final.name}.partial-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    previous = _raise_on_sigterm()
    try:
        yield tmp
        move_into_place(tmp, final)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def move_into_place(tmp: Path, final: Path) -> None:
    """Renames the finished directory `tmp` to `final`; an existing `final` is swapped out, then removed."""
    if final.exists():
        trash = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(final, trash)
        os.rename(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp, final)


def _raise_on_sigterm():
    """Turns SIGTERM into Terminated (a KeyboardInterrupt) so cleanup runs; returns the old handler
    (main thread only)."""
    try:
        return signal.signal(signal.SIGTERM, raise_terminated)
    except ValueError:  # not the main thread
        return None


def write_group(path: str | os.PathLike, attributes: dict[str, Any]) -> None:
    """Writes (or replaces) the zarr v3 group metadata with `attributes` at `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    meta = {"zarr_format": 3, "node_type": "group", "attributes": attributes}
    tmp = path / (GROUP_METADATA + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True))
    os.replace(tmp, path / GROUP_METADATA)


def utf8_text(value: Any) -> Any:
    """`value` with every string (in nested dicts, lists and tuples too) made valid UTF-8.

    A file name that is not valid UTF-8 reaches Python with its bad bytes as lone surrogates
    (surrogateescape); each such byte becomes the four characters `\\xNN`, so `caf\\xe9` stands
    for the Latin-1 name b"caf\\xe9". Valid names are unchanged.
    """
    if isinstance(value, str):
        try:
            raw = os.fsencode(value)
        except UnicodeEncodeError:  # a lone surrogate that no file name produced
            raw = value.encode("utf-8", "replace")
        return raw.decode("utf-8", "backslashreplace")
    if isinstance(value, dict):
        return {utf8_text(k): utf8_text(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [utf8_text(v) for v in value]
    return value


def read_attributes(path: str | os.PathLike) -> dict[str, Any]:
    """The attributes of the zarr v3 group at `path`; InputError if it is not one."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    meta_path = path / GROUP_METADATA
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        raise InputError(f"{path}: not a zarr v3 group (no readable {GROUP_METADATA})") from None
    if meta.get("node_type") != "group":
        raise InputError(f"{path}: not a zarr v3 group")
    return meta.get("attributes", {})


def base_attributes(kind: str, **extra: Any) -> dict[str, Any]:
    """Attributes every file this tool writes carries: what it is and which version wrote it."""
    return {"jepa_kind": kind, "jepa_version": __version__, **extra}


def _spec(path: Path) -> dict[str, Any]:
    return {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(Path(path).resolve())}}


def chunk_rows(sample_shape: tuple[int, ...], itemsize: int, target_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Samples per chunk so that one chunk holds about `target_bytes`."""
    per_sample = max(1, int(np.prod(sample_shape)) * itemsize)
    return max(1, min(65536, target_bytes // per_sample))


def create_array(path: str | os.PathLike, shape: tuple[int, ...], dtype: np.dtype | str,
                 chunk_n: int | None = None, compress: bool = True):
    """Creates a zarr v3 array with TensorStore, chunked along the first axis, zstd-compressed.

    Returns the open TensorStore (write with `store[a:b].write(x).result()`).
    """
    import tensorstore as ts

    dtype = np.dtype(dtype)
    if chunk_n is None:
        chunk_n = chunk_rows(tuple(shape[1:]), dtype.itemsize)
    chunk = [max(1, min(chunk_n, shape[0]))] + list(shape[1:])
    chunk = [max(1, c) for c in chunk]
    codecs: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": "little"}}]
    if compress:
        codecs.append({"name": "zstd", "configuration": {"level": 3, "checksum": False}})
    spec = _spec(Path(path)) | {
        "metadata": {
            "shape": list(shape),
            "data_type": _zarr_dtype(dtype),
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunk}},
            "codecs": codecs,
            "fill_value": False if dtype == np.bool_ else 0,
        },
        "create": True,
        "delete_existing": True,
    }
    return ts.open(spec).result()


def _zarr_dtype(dtype: np.dtype) -> str:
    if dtype == np.bool_:
        return "bool"
    return dtype.name


def write_array(path: str | os.PathLike, array: np.ndarray, chunk_n: int | None = None) -> None:
    """Writes a whole in-memory array as a zarr v3 array."""
    array = np.asarray(array)
    store = create_array(path, array.shape, array.dtype, chunk_n)
    store.write(array).result()


def open_array(path: str | os.PathLike, write: bool = False):
    """Opens an existing zarr v3 array with TensorStore; InputError if it is missing."""
    import tensorstore as ts

    path = Path(path)
    if not (path / "zarr.json").exists():
        raise InputError(f"{path}: no zarr array here")
    spec = _spec(path) | {"open": True}
    try:
        return ts.open(spec, read=True, write=write).result()
    except ValueError as exc:
        raise InputError(f"{path}: cannot open as a zarr v3 array ({exc})") from None


def read_array(path: str | os.PathLike) -> np.ndarray:
    """Reads a whole zarr v3 array into memory."""
    return open_array(path).read().result()


def resize_first_axis(store, n: int):
    """Shrinks or grows the first axis of an open array to `n`; returns the resized store."""
    return store.resize(exclusive_max=[n] + list(store.shape[1:]), shrink_only=False).result()


def disk_bytes(path: str | os.PathLike) -> int:
    """Bytes the directory tree at `path` takes on disk (file sizes)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, name))
    return total
