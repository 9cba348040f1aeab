"""Zarr v3 groups and arrays on disk: group attributes, TensorStore arrays, damage reported as one line.

Every subcommand reads and writes datasets through this module, so the on-disk contract
(docs/formats.md) lives in one place. Atomic writes of whole outputs are in data/atomic.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jepa_cli import __version__
from jepa_cli.data import buckets
from jepa_cli.data.files import check_regular_tree, read_json, replace_file
from jepa_cli.data.urls import BucketPath, failure, location
from jepa_cli.errors import InputError, raise_if_signalled_since, signal_mark, signals_deferred

GROUP_METADATA = "zarr.json"
DEFAULT_CHUNK_BYTES = 4 << 20  # aim for ~4 MiB chunks along the sample axis
REWRITE = "re-create it with the command that wrote it (e.g. jepa ingest ... --force)"  # the fix for damage


def write_group(path: str | os.PathLike, attributes: dict[str, Any]) -> None:
    """Writes (or replaces) the zarr v3 group metadata with `attributes` at `path`.

    Strings pass through `utf8_text`, so file names that are not UTF-8 never reach the file as
    lone surrogates."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    meta = {"zarr_format": 3, "node_type": "group", "attributes": utf8_text(attributes)}
    replace_file(path / GROUP_METADATA, json.dumps(meta, indent=2, sort_keys=True).encode())

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

def read_attributes(path: str | os.PathLike | BucketPath) -> dict[str, Any]:
    """The attributes of the zarr v3 group at `path` (a folder or a bucket URL); InputError if it is
    not one or is damaged."""
    path = location(path)
    meta = read_metadata(path, "group")
    if not isinstance(meta.get("attributes", {}), dict):
        raise InputError(f"{path / GROUP_METADATA}: its attributes are not a JSON object; {REWRITE}")
    return meta.get("attributes", {})

def read_metadata(path: str | os.PathLike | BucketPath, node_type: str) -> dict[str, Any]:
    """The parsed zarr.json of the zarr v3 `node_type` ("group" or "array") at `path` (a folder or
    a bucket prefix); InputError naming the file if it is missing, not JSON, or describes something
    else. A bucket prefix without its group zarr.json is incomplete (`buckets.missing_group`)."""
    path = location(path)
    if isinstance(path, BucketPath):
        return _bucket_metadata(path, node_type)
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    meta_path = path / GROUP_METADATA
    if not meta_path.is_file():
        raise InputError(f"{path}: not a zarr v3 {node_type} (no {GROUP_METADATA})")
    try:
        meta = read_json(meta_path)
    except (OSError, ValueError) as exc:
        raise InputError(f"{meta_path}: corrupt zarr metadata ({_first_line(exc)}); {REWRITE}") from None
    if not isinstance(meta, dict) or meta.get("node_type") != node_type:
        raise InputError(f"{meta_path}: not the metadata of a zarr v3 {node_type}; {REWRITE}")
    return meta

def _bucket_metadata(url: BucketPath, node_type: str) -> dict[str, Any]:
    """read_metadata for a bucket prefix."""
    from jepa_cli.data.files import DamagedFile, parse_json

    raw = buckets.read_object(url, GROUP_METADATA)
    if raw is None:
        raise buckets.missing_group(url)
    try:
        meta = parse_json(raw, url / GROUP_METADATA)
    except DamagedFile as exc:
        raise InputError(f"{url / GROUP_METADATA}: corrupt zarr metadata ({exc.reason}); {REWRITE}") from None
    if not isinstance(meta, dict) or meta.get("node_type") != node_type:
        raise InputError(f"{url / GROUP_METADATA}: not the metadata of a zarr v3 {node_type}; {REWRITE}")
    return meta

def base_attributes(kind: str, **extra: Any) -> dict[str, Any]:
    """Attributes every file this tool writes carries: what it is and which version wrote it."""
    return {"jepa_kind": kind, "jepa_version": __version__, **extra}

def zarr_spec(path: str | os.PathLike | BucketPath) -> dict[str, Any]:
    """The TensorStore spec of the zarr v3 array at `path`: a folder, or a bucket prefix
    (`BucketPath.kvstore`: endpoint, region and credentials from the environment)."""
    path = location(path)
    if isinstance(path, BucketPath):
        return {"driver": "zarr3", "kvstore": path.kvstore()}
    return {"driver": "zarr3", "kvstore": {"driver": "file", "path": check_utf8(path)}}

def check_utf8(path: str | os.PathLike) -> str:
    """The absolute path as a str; InputError if it is not valid UTF-8 (TensorStore cannot address it)."""
    absolute = str(Path(path).resolve())
    try:
        absolute.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{utf8_text(str(path))}: the path is not valid UTF-8, which TensorStore cannot open; "
                         "rename it (file names inside an image folder may be anything)") from None
    return absolute

def chunk_rows(sample_shape: tuple[int, ...], itemsize: int, target_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Samples per chunk so that one chunk holds about `target_bytes`."""
    per_sample = max(1, int(np.prod(sample_shape)) * itemsize)
    return max(1, min(65536, target_bytes // per_sample))

def create_array(path: str | os.PathLike, shape: tuple[int, ...], dtype: np.dtype | str,
                 chunk_n: int | None = None, compress: bool = True):
    """Creates a zarr v3 array with TensorStore, chunked along the first axis, zstd-compressed.

    Returns the open TensorStore (write with `complete(lambda: store[a:b].write(x))`).
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
    spec = zarr_spec(path) | {
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
    return complete(lambda: ts.open(spec))

def complete(start: Callable[[], Any]) -> Any:
    """Starts a TensorStore operation that writes (`start()`: an open that creates, a write, a resize)
    and returns its result, waiting for it to finish even when a signal interrupts: a write left in
    flight would put files back into a partial output that the interrupted command is removing. A
    signal while `start()` runs is held until its future is in hand, so no future is ever dropped."""
    mark = signal_mark()
    future = None
    try:
        with signals_deferred():
            future = start()
        raise_if_signalled_since(mark)
        return future.result()
    except BaseException:
        while future is not None and not future.done():
            try:
                future.result()
            except BaseException:  # a second signal, or the write's own error: the first exception wins
                pass
        raise

def _zarr_dtype(dtype: np.dtype) -> str:
    if dtype == np.bool_:
        return "bool"
    return dtype.name

def write_array(path: str | os.PathLike, array: np.ndarray, chunk_n: int | None = None) -> None:
    """Writes a whole in-memory array as a zarr v3 array."""
    array = np.asarray(array)
    store = create_array(path, array.shape, array.dtype, chunk_n)
    complete(lambda: store.write(array))

def open_array(path: str | os.PathLike | BucketPath, write: bool = False):
    """Opens an existing zarr v3 array (in a folder or a bucket) with TensorStore; InputError if it
    is missing or its metadata is damaged."""
    import tensorstore as ts

    path = location(path)
    if isinstance(path, BucketPath):
        read_metadata(path, "array")
        try:
            return ts.open(zarr_spec(path) | {"open": True}, read=True, write=write).result()
        except ValueError as exc:
            raise failure(path, exc) from None
    path = Path(path)
    if not (path / "zarr.json").exists():
        raise InputError(f"{path}: no zarr array here")
    check_regular_tree(path)  # a chunk that is a named pipe would hang TensorStore's read
    spec = zarr_spec(path) | {"open": True}
    try:
        return ts.open(spec, read=True, write=write).result()
    except ValueError as exc:
        where = path / "zarr.json" if "zarr.json" in str(exc) else path
        raise InputError(f"{where}: cannot open as a zarr v3 array ({_tensorstore_reason(exc)}); {REWRITE}") from None

def read(array, rows: slice | None = None) -> np.ndarray:
    """`array[rows]` (all of it by default) of an open TensorStore array, in memory.

    A damaged chunk (truncated, or not valid zstd) is an InputError naming the array and the
    chunk file, instead of TensorStore's status dump. Every reader of a dataset reads through here.
    """
    try:
        return (array if rows is None else array[rows]).read().result()
    except ValueError as exc:
        where = array.kvstore.path.rstrip("/")
        chunk = re.search(r'Error reading local file "([^"]+)"', str(exc))
        if chunk is None:
            raise InputError(f"{where}: cannot read ({_tensorstore_reason(exc)})") from None
        key = os.path.relpath(chunk.group(1), where)
        raise InputError(f"{where}: chunk {key} is damaged ({_tensorstore_reason(exc)}); {REWRITE}") from None

def _tensorstore_reason(exc: Exception) -> str:
    """TensorStore's message without its status code, file name and spec dump: the cause only."""
    text = re.sub(r"\s*\[tensorstore_spec=.*", "", str(exc), flags=re.S)
    text = re.sub(r'^[A-Z_]+: ', "", text)
    text = re.sub(r'Error opening "\w+" driver: ', "", text)
    text = re.sub(r'Error reading [^:]*"[^"]*": ', "", text)
    return _first_line(text)

def _first_line(value: Any) -> str:
    return " ".join(str(value).split())[:300]

def read_array(path: str | os.PathLike) -> np.ndarray:
    """Reads a whole zarr v3 array into memory."""
    return read(open_array(path))

class RowWriter:
    """Appends rows to an open array (from create_array) through a buffer of `chunk_n` rows: one
    chunk-aligned write per full buffer. `finish()` writes what is left and shrinks the array to the
    rows written (fewer than it was created with when samples were skipped)."""

    def __init__(self, array, chunk_n: int):
        self.array = array
        self.buffer = np.empty((chunk_n, *array.shape[1:]), array.dtype.numpy_dtype)
        self.filled = 0  # rows in the buffer
        self.written = 0  # rows in the array

    def append(self, row: np.ndarray) -> None:
        self.buffer[self.filled] = row
        self.filled += 1
        if self.filled == len(self.buffer):
            self._flush()

    def _flush(self) -> None:
        if self.filled:
            complete(lambda: self.array[self.written:self.written + self.filled].write(self.buffer[:self.filled]))
            self.written += self.filled
            self.filled = 0

    def finish(self) -> None:
        self._flush()
        if self.written != self.array.shape[0]:
            self.array = resize_first_axis(self.array, self.written)

def resize_first_axis(store, n: int):
    """Shrinks or grows the first axis of an open array to `n`; returns the resized store."""
    return complete(lambda: store.resize(exclusive_max=[n] + list(store.shape[1:]), shrink_only=False))

def disk_bytes(path: str | os.PathLike | BucketPath) -> int | None:
    """Bytes the directory tree at `path` takes on disk (file sizes); None for a bucket prefix,
    whose object sizes TensorStore's listing does not give."""
    if isinstance(location(path), BucketPath):
        return None
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, name))
    return total

def dataset_fingerprint(path: str | os.PathLike | BucketPath) -> str:
    """A SHA-256 of what a dataset directory holds, without reading its data: the group's and each
    array's zarr.json bytes, and every chunk file's relative path, size and mtime (ns).

    Re-ingesting a dataset under the same path and shape rewrites its chunk files (new mtimes,
    usually new sizes), so the fingerprint changes: a resumable job keyed on it never mixes the
    old content with the new. In a bucket: `buckets.fingerprint` (each object's generation)."""
    path = location(path)
    if isinstance(path, BucketPath):
        return buckets.fingerprint(path)
    root = Path(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = file.relative_to(root).as_posix()
        if rel.startswith(".") or "/." in rel:
            continue  # hidden files (e.g. a writer's lock) are not content
        info = file.stat()
        digest.update(f"{rel}\0{info.st_size}\0{info.st_mtime_ns}\0".encode("utf-8", "surrogateescape"))
        if file.name == GROUP_METADATA:
            digest.update(file.read_bytes())
    return digest.hexdigest()
