"""Reading the files the toolkit parses (run.json, metrics.jsonl, zarr.json, job.json, ...) and the
files it hands to other readers (zarr chunks, .npy sources): only regular files, and for JSON up to a
size and a nesting depth, as UTF-8. Anything else is one InputError naming the file (docs/formats.md).
Rewriting such a file goes through `replace_file`, the one way the toolkit replaces a file it keeps.

A named pipe, a device or a socket is refused before it is read: reading one would wait forever
(a pipe with no writer) or never end (/dev/zero).
"""

from __future__ import annotations

import functools
import json
import os
import stat
from pathlib import Path
from typing import Any

from jepa_cli.errors import InputError

JSON_LIMIT = 64 << 20  # bytes: run.json, zarr.json, job.json and the like hold a few KiB
JSONL_LIMIT = 1 << 30  # bytes: metrics.jsonl grows by one row per logged step
MAX_DEPTH = 100  # levels of nested objects and lists; what the toolkit writes nests a handful
_INT_DIGITS = 18  # longer integers are read as floats (a number with 400 digits is +-inf, not an int)


class DamagedFile(InputError, ValueError):
    """A file whose bytes are not what its reader parses: not UTF-8, not JSON, nested too deeply.

    `reason` says what, with the line (`line 3: not valid UTF-8`), without the path. A ValueError too,
    so a reader that reports damage in its own words catches it with the JSON errors."""

    def __init__(self, path: str | os.PathLike, reason: str):
        super().__init__(f"{path}: {reason}")
        self.reason = reason


def _kind(mode: int, device: int | None = None) -> str | None:
    """What a file of `mode` (on the file system `device`, st_dev) is when it is not a regular file
    holding bytes, else None: the kernel's pseudo-files (/proc, /sys) say they are regular files of
    size 0 and hold text made up when read."""
    if device is not None and device in _pseudo_devices():
        return "a pseudo-file of the kernel (/proc, /sys)"
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (fifo)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


@functools.cache
def _pseudo_devices() -> frozenset[int]:
    """The st_dev of /proc and /sys on this machine (none where they do not exist)."""
    devices = set()
    for folder in ("/proc", "/sys"):
        try:
            devices.add(os.stat(folder).st_dev)
        except OSError:
            pass
    return frozenset(devices)


def _refuse(path: str | os.PathLike, kind: str) -> InputError:
    return InputError(f"{path}: is {kind}, not a regular file; only regular files are read")


def check_regular(path: str | os.PathLike) -> None:
    """InputError unless `path` (a symbolic link followed) is a regular file; a missing file passes
    (its reader says it is missing). Costs one stat, no open."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return
    except OSError:
        return  # unreadable: the reader's own open reports it
    kind = _kind(info.st_mode, info.st_dev)
    if kind is not None:
        raise _refuse(path, kind)


def check_regular_tree(root: str | os.PathLike) -> None:
    """InputError naming the first entry below the folder `root` that is neither a folder nor a regular
    file (a chunk replaced by a named pipe would hang TensorStore's read). Hidden entries are skipped."""
    stack = [os.fspath(root)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue  # a missing or unreadable folder: the reader reports it
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                    continue
                mode = entry.stat().st_mode  # a symbolic link followed
            except OSError:
                continue
            kind = _kind(mode)
            if kind is not None and not stat.S_ISDIR(mode):
                raise _refuse(entry.path, kind)


def read_regular(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of the regular file `path`; InputError if it is anything else (checked on the open
    file, opened without waiting for a writer; a pseudo-file of /proc or /sys too) or larger than
    `limit` bytes. Exactly the size the file has when opened is read: a file being appended to reads
    as it was then. OSError (missing, no permission) is left to the caller."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        kind = _kind(info.st_mode, info.st_dev)
        if kind is not None:
            raise _refuse(path, kind)
        if info.st_size > limit:
            raise InputError(f"{path}: {info.st_size} bytes, more than the {limit} bytes this file may hold; "
                             "it is not one the toolkit wrote")
        chunks, left = [], info.st_size
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _parse_int(text: str) -> int | float:
    return int(text) if len(text.lstrip("-")) <= _INT_DIGITS else float(text)


def _too_deep(value: Any) -> bool:
    """Whether `value` nests objects and lists deeper than MAX_DEPTH (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, (dict, list)):
            continue
        children = item.values() if isinstance(item, dict) else item
        if depth > MAX_DEPTH:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def parse_json(text: str | bytes, path: str | os.PathLike, first_line: int = 1) -> Any:
    """The JSON value `text` holds (bytes must be UTF-8); DamagedFile naming `path` and the line
    (counted from `first_line`) if it is not UTF-8, not JSON or nested deeper than MAX_DEPTH.
    Integers longer than 18 digits are read as floats."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = first_line + text.count(b"\n", 0, exc.start)
            raise DamagedFile(path, f"line {line}: not valid UTF-8") from None
    try:
        value = json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as exc:
        raise DamagedFile(path, f"line {first_line + exc.lineno - 1}: not JSON ({exc.msg})") from None
    except RecursionError:  # deeper than Python's own limit
        value, deep = None, True
    else:  # fewer brackets than MAX_DEPTH cannot nest deeper
        deep = text.count("[") + text.count("{") > MAX_DEPTH and _too_deep(value)
    if deep:
        raise DamagedFile(path, f"line {first_line}: nested deeper than {MAX_DEPTH} levels")
    return value


def read_json(path: str | os.PathLike, limit: int = JSON_LIMIT) -> Any:
    """The JSON value of the regular file `path` (read_regular, then parse_json): InputError if it is
    not a regular file or too large, DamagedFile if its bytes are not UTF-8 JSON nested at most
    MAX_DEPTH deep. OSError (missing, no permission) is left to the caller."""
    return parse_json(read_regular(path, limit), path)


def read_jsonl(path: str | os.PathLike, limit: int = JSONL_LIMIT) -> list[tuple[str, Any]]:
    """(line, value) for each line of the JSON Lines file `path` that holds UTF-8 JSON nested at most
    MAX_DEPTH deep; any other line (one cut short by a kill, random bytes) is skipped. InputError if
    the file is not a regular file or is larger than `limit`. OSError is left to the caller."""
    out = []
    for number, raw in enumerate(read_regular(path, limit).split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            value = parse_json(raw, path, number)
        except DamagedFile:
            continue
        out.append((raw.decode("utf-8"), value))
    return out


def replace_file(path: str | os.PathLike, data: bytes) -> None:
    """Writes `data` as the file `path`, atomically and durably: into the hidden sibling `.NAME.tmp`,
    flushed to disk, renamed over `path`, and the folder flushed so that the rename outlives a crash.
    A reader (or a crash, a kill, a full disk) sees the old file or the new one, never part of one;
    on any failure (SIGINT/SIGTERM included) the sibling is removed and the exception goes on."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sync_folder(path.parent)


def sync_folder(folder: str | os.PathLike) -> None:
    """Flushes the folder's entries (a rename or a new file in it) to disk; a file system that cannot
    open or flush a folder is left as it is."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
