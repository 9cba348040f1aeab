"""Zarr v3 groups on disk: atomic directory writes, TensorStore arrays, group attributes.

Every subcommand reads and writes through this module, so the on-disk contract
(docs/formats.md) lives in one place.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from jepa_cli import __version__
from jepa_cli.errors import InputError, note_completed, raise_if_signalled_since, raise_terminated, signal_mark

GROUP_METADATA = "zarr.json"
DEFAULT_CHUNK_BYTES = 4 << 20  # aim for ~4 MiB chunks along the sample axis
PARTIAL_PREFIX = ".{name}.partial-"  # + 8 hex digits: the temporary sibling of an atomic write
AT_FDCWD, RENAME_NOREPLACE = -100, 1  # linux/fcntl.h, linux/fs.h
REWRITE = "re-create it with the command that wrote it (e.g. jepa ingest ... --force)"  # the fix for damage


def check_output(path: str | os.PathLike, force: bool, kind: str,
                 inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Refuses an output that would destroy data; returns the path.

    Refused: an output that is, contains or lies inside one of `inputs` (symlinks and relative
    paths resolved); an existing output without `force`; with `force`, anything but a jepa
    artifact of the same `kind` (its `jepa_kind`), e.g. a user's folder, a file or a run.
    """
    path = Path(path)
    check_disjoint(path, inputs)
    _check_utf8(path)
    if not path.parent.is_dir():
        raise InputError(f"{path.parent}: output directory does not exist")
    if os.path.lexists(path):
        check_replaceable(path, kind)  # first: suggest --force only where it would work
        if not force:
            raise InputError(f"{path}: already exists (use --force to overwrite)")
    return path


def check_disjoint(output: str | os.PathLike, inputs: Iterable[str | os.PathLike]) -> None:
    """InputError if `output` is, contains or lies inside one of `inputs` (writing it would delete
    or mix into an input)."""
    out = Path(output).resolve()
    for given in inputs:
        source = Path(given).resolve()
        if out == source:
            relation = "is the input"
        elif source in out.parents:
            relation = "lies inside the input"
        elif out in source.parents:
            relation = "contains the input"
        else:
            continue
        raise InputError(f"{output}: the output {relation} {given}; choose an output outside every input")


def check_replaceable(path: str | os.PathLike, kind: str, shown: str | os.PathLike | None = None) -> None:
    """InputError unless `path` is a directory holding a jepa artifact of `kind`: what `--force` may
    replace. `shown` is the path named in the message (default `path`)."""
    path = Path(path)
    shown = shown or path
    advice = (f"--force replaces only an output of the same kind (jepa_kind {kind!r}); remove it yourself "
              "or choose another output")
    if path.is_symlink():
        raise InputError(f"{shown}: is a symbolic link; {advice}")
    if not path.is_dir():
        raise InputError(f"{shown}: is a file, not a jepa output; {advice}")
    found = _jepa_kind(path)
    if found != kind:
        what = f"holds jepa_kind {found!r}" if isinstance(found, str) else "is not a jepa output (no jepa_kind)"
        raise InputError(f"{shown}: {what}; {advice}")


def _jepa_kind(path: Path) -> Any:
    """The `jepa_kind` attribute of the directory `path`, or None if it is not a readable zarr group."""
    try:
        return read_attributes(path).get("jepa_kind")
    except InputError:
        return None


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, force: bool, kind: str, inputs: Iterable[str | os.PathLike] = (),
                     log: Callable[[str], None] | None = None) -> Iterator[Path]:
    """Yields a temporary sibling of `path`; moves it into place only if the block succeeds.

    The output is checked first (`check_output`). Stale partials of earlier writes of `path` whose
    writer is gone are removed (each reported through `log`). The temporary directory is locked
    for this process's lifetime (`flock`, released by the kernel even on SIGKILL), which is how a
    later writer knows it is stale. An exception, SIGINT or SIGTERM inside the block removes it, so
    a failed or interrupted write never leaves `path` behind (nor damages an existing one).
    """
    final = check_output(path, force, kind, inputs)
    tmp = final.with_name(f"{PARTIAL_PREFIX.format(name=final.name)}{uuid.uuid4().hex[:8]}")
    lock = None
    mark = signal_mark()
    previous = _raise_on_sigterm()  # before mkdir: a signal right after it still removes the partial
    try:
        with _directory_lock(final.parent):
            for message in remove_stale_partials(final):
                if log:
                    log(message)
            tmp.mkdir()
            lock = _lock_directory(tmp)
        yield tmp
        raise_if_signalled_since(mark)  # a signal whose exception a callback swallowed: never commit
        move_into_place(tmp, final, force, kind)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if lock is not None:
            os.close(lock)


def remove_stale_partials(final: str | os.PathLike) -> list[str]:
    """Removes what interrupted writes of `final` left behind; returns one message per removal.

    `.NAME.partial-<8 hex digits>/` is removed when no process holds its lock (its writer is gone, even
    if killed with SIGKILL); a live writer's partial is kept. `.NAME.old-<8 hex digits>/`, a jepa output
    that a `--force` swap replaced, is removed when NAME exists (the swap completed; anything else
    is kept). encode-latents' resumable `.NAME.partial/` does not match and is kept on purpose.
    """
    final = Path(final)
    partial = re.compile(re.escape(PARTIAL_PREFIX.format(name=final.name)) + "[0-9a-f]{8}")
    swapped = re.compile(re.escape(f".{final.name}.old-") + "[0-9a-f]{8}")
    messages = []
    for entry in sorted(final.parent.iterdir()):
        if partial.fullmatch(entry.name):
            lock = _lock_directory(entry)
            if lock is None:  # a live writer holds it (or the file system cannot tell): keep it
                continue
            try:
                shutil.rmtree(entry, ignore_errors=True)
            finally:
                os.close(lock)
            messages.append(f"removed {entry}, left by an interrupted write whose process is gone")
        elif swapped.fullmatch(entry.name) and final.is_dir() and _jepa_kind(entry) is not None:
            shutil.rmtree(entry, ignore_errors=True)
            messages.append(f"removed {entry}, an output replaced by an interrupted --force write")
    return messages


def move_into_place(tmp: Path, final: Path, force: bool, kind: str) -> None:
    """Renames the finished directory `tmp` to `final`, never over something that appeared meanwhile.

    Without `force` an existing `final` is an InputError (the check and the rename are one atomic
    step, so of two concurrent writers exactly one wins). With `force` an existing `final` is
    checked again (`check_replaceable`, at move time), swapped out, and removed once `tmp` is in place.
    """
    try:
        rename_no_replace(tmp, final)
        note_completed(final)
        return
    except FileExistsError:
        if not force:
            raise InputError(f"{final}: already exists (another process wrote it while this command ran; "
                             "use --force to overwrite)") from None
    trash = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(final, trash)
    except FileNotFoundError:  # removed meanwhile: nothing to swap out
        return move_into_place(tmp, final, force=False, kind=kind)
    try:
        check_replaceable(trash, kind, shown=final)  # what was there at move time, now ours alone
        rename_no_replace(tmp, final)
    except FileExistsError:  # another writer's output took the place between the two renames: it stays
        raise InputError(f"{final}: another process wrote it while this command ran (its output is kept)") from None
    except BaseException:  # also SIGINT/SIGTERM: put the previous output back
        try:
            rename_no_replace(trash, final)
        except OSError:
            raise InputError(f"{final}: another process wrote it while this command ran; what was there "
                             f"before is now {trash}") from None
        raise
    note_completed(final)
    shutil.rmtree(trash, ignore_errors=True)


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"  # the first bytes of every PNG file


def check_output_file(path: str | os.PathLike, force: bool, magic: bytes, what: str) -> Path:
    """Refuses a file output that would destroy data; returns the path. An existing path is refused
    without `force`, and with `force` unless it is a regular file starting with `magic` (a `what`,
    e.g. "PNG picture"): a user's other file, a directory or a symbolic link is never replaced."""
    path = Path(path)
    _check_utf8(path)
    if not path.parent.is_dir():
        raise InputError(f"{path.parent}: output directory does not exist")
    if os.path.lexists(path):
        _check_replaceable_file(path, magic, what)
        if not force:
            raise InputError(f"{path}: already exists (use --force to overwrite)")
    return path


def _check_replaceable_file(path: Path, magic: bytes, what: str) -> None:
    advice = f"--force replaces only a {what}; remove it yourself or choose another output"
    if path.is_symlink() or not path.is_file():
        raise InputError(f"{path}: is not a regular file; {advice}")
    with open(path, "rb") as fh:
        if fh.read(len(magic)) != magic:
            raise InputError(f"{path}: is not a {what}; {advice}")


def write_file(path: str | os.PathLike, data: bytes, force: bool, magic: bytes, what: str) -> None:
    """Writes `data` to the file `path` atomically: into a hidden temporary sibling renamed into place,
    never over a path that appeared meanwhile without `force`, and with `force` only over a `what`
    (`check_output_file`, checked again at the move)."""
    path = check_output_file(path, force, magic, what)
    tmp = path.with_name(f".{path.name}.partial-{uuid.uuid4().hex[:8]}")
    mark = signal_mark()
    previous = _raise_on_sigterm()
    try:
        tmp.write_bytes(data)
        raise_if_signalled_since(mark)
        try:
            rename_no_replace(tmp, path)
        except FileExistsError:
            if not force:
                raise InputError(f"{path}: already exists (another process wrote it while this command ran; "
                                 "use --force to overwrite)") from None
            _check_replaceable_file(path, magic, what)
            os.replace(tmp, path)
        note_completed(path)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        tmp.unlink(missing_ok=True)


def rename_no_replace(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Renames `src` to `dst`; FileExistsError if `dst` exists, even an empty directory.

    Linux: one atomic renameat2(RENAME_NOREPLACE). Elsewhere, or on a file system without it: the
    check and os.rename under an flock of the parent directory, which excludes other jepa writers.
    """
    if _renameat2 is not None:
        done = _renameat2(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), RENAME_NOREPLACE)
        if done == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):  # EINVAL: the file system lacks the flag
            raise OSError(err, os.strerror(err), str(src), None, str(dst))
    with _directory_lock(Path(dst).parent):
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
        os.rename(src, dst)


def _load_renameat2():
    """libc's renameat2, or None where there is none (not Linux, old glibc)."""
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_renameat2 = _load_renameat2()


def _lock_directory(path: Path) -> int | None:
    """An open descriptor of directory `path` holding its exclusive flock, or None if another open
    file holds it (or the file system cannot lock). The kernel drops the lock when the process dies."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def _directory_lock(path: Path) -> Iterator[None]:
    """Holds a blocking flock of directory `path` (serialises jepa writers in one output folder);
    proceeds unlocked on a file system that cannot lock."""
    fd = os.open(path, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def resumable_partial(partial: str | os.PathLike, final: str | os.PathLike) -> Iterator[Path]:
    """Holds the resumable partial directory `partial` of the output `final` (the `.NAME.partial/` of
    encode-latents and sample, kept across interruptions), created if needed, locked for the block. The kernel
    drops the lock when the process dies, so a later run resumes what a killed one left; a file
    system that cannot lock proceeds unlocked. InputError when a live process holds it: two writers
    never share one partial output."""
    partial, final = Path(partial), Path(final)
    refusal = InputError(f"{partial}: is not a partial output (a symbolic link or a file); remove it yourself "
                         "or write to another output")
    if partial.is_symlink() or (partial.exists() and not partial.is_dir()):
        raise refusal
    with _directory_lock(partial.parent):
        partial.mkdir(exist_ok=True)
        try:  # never through a link that appeared since the check
            fd = os.open(partial, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            raise refusal from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"{final}: another process is writing it now (its partial output {partial} is in "
                             "use); wait for it to finish, or write to another output") from None
        except OSError:  # a file system without locks: proceed unlocked, as _directory_lock does
            pass
        yield partial
    finally:
        os.close(fd)


def _raise_on_sigterm():
    """Turns SIGTERM into Terminated (a KeyboardInterrupt) so cleanup runs; returns the old handler
    (main thread only)."""
    try:
        return signal.signal(signal.SIGTERM, raise_terminated)
    except ValueError:  # not the main thread
        return None


def write_group(path: str | os.PathLike, attributes: dict[str, Any]) -> None:
    """Writes (or replaces) the zarr v3 group metadata with `attributes` at `path`.

    Strings pass through `utf8_text`, so file names that are not UTF-8 never reach the file as
    lone surrogates."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    meta = {"zarr_format": 3, "node_type": "group", "attributes": utf8_text(attributes)}
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
    """The attributes of the zarr v3 group at `path`; InputError if it is not one or is damaged."""
    meta = read_metadata(path, "group")
    if not isinstance(meta.get("attributes", {}), dict):
        raise InputError(f"{Path(path) / GROUP_METADATA}: its attributes are not a JSON object; {REWRITE}")
    return meta.get("attributes", {})


def read_metadata(path: str | os.PathLike, node_type: str) -> dict[str, Any]:
    """The parsed zarr.json of the zarr v3 `node_type` ("group" or "array") at `path`; InputError
    naming the file if it is missing, not JSON, or describes something else."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    meta_path = path / GROUP_METADATA
    if not meta_path.is_file():
        raise InputError(f"{path}: not a zarr v3 {node_type} (no {GROUP_METADATA})")
    try:
        meta = json.loads(meta_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise InputError(f"{meta_path}: corrupt zarr metadata ({_first_line(exc)}); {REWRITE}") from None
    if not isinstance(meta, dict) or meta.get("node_type") != node_type:
        raise InputError(f"{meta_path}: not the metadata of a zarr v3 {node_type}; {REWRITE}")
    return meta


def base_attributes(kind: str, **extra: Any) -> dict[str, Any]:
    """Attributes every file this tool writes carries: what it is and which version wrote it."""
    return {"jepa_kind": kind, "jepa_version": __version__, **extra}


def _spec(path: Path) -> dict[str, Any]:
    return {"driver": "zarr3", "kvstore": {"driver": "file", "path": _check_utf8(path)}}


def _check_utf8(path: str | os.PathLike) -> str:
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
    """Opens an existing zarr v3 array with TensorStore; InputError if it is missing or its
    metadata is damaged."""
    import tensorstore as ts

    path = Path(path)
    if not (path / "zarr.json").exists():
        raise InputError(f"{path}: no zarr array here")
    spec = _spec(path) | {"open": True}
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


def check_room(output: str | os.PathLike, disk: int, memory: int, disk_hint: str, memory_hint: str) -> None:
    """InputError if writing `output` needs more than the free disk of its folder (`disk` bytes) or
    the memory this process can still get (`memory` bytes); the message gives both figures and a hint."""
    output = Path(output)
    check_memory(output, memory, memory_hint)
    free_disk = shutil.disk_usage(output.parent).free
    if disk > free_disk:
        raise InputError(f"{output}: needs about {format_bytes(disk)} of disk but {format_bytes(free_disk)} is "
                         f"free in {output.parent}; {disk_hint}")


def check_memory(where: str | os.PathLike, memory: int, hint: str) -> None:
    """InputError naming `where` if `memory` bytes exceed what this process can still get; the message
    gives both figures and the hint."""
    free_memory = available_memory()
    if free_memory is not None and memory > free_memory:
        raise InputError(f"{where}: needs about {format_bytes(memory)} of memory but {format_bytes(free_memory)} "
                         f"is available; {hint}")


def available_memory() -> int | None:
    """Bytes this process can still allocate without swapping, or None where unknown.

    Linux: MemAvailable (free memory plus reclaimable caches), capped by the cgroup's limit less
    its usage (containers); elsewhere free pages from os.sysconf.
    """
    found = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/meminfo") as meminfo:
            found = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    if found is None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            found = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        with contextlib.suppress(OSError, ValueError):
            room = int(Path(limit_file).read_text()) - int(Path(usage_file).read_text())  # "max" -> ValueError
            found = room if found is None else min(found, room)
            break
    return found


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    power = 0
    while abs(n) >= 1024 and power < len(units) - 1:
        n, power = n / 1024, power + 1
    return f"{n:.0f} B" if power == 0 else f"{n:.1f} {units[power]}"


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
            self.array[self.written:self.written + self.filled].write(self.buffer[:self.filled]).result()
            self.written += self.filled
            self.filled = 0

    def finish(self) -> None:
        self._flush()
        if self.written != self.array.shape[0]:
            self.array = resize_first_axis(self.array, self.written)


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


def dataset_fingerprint(path: str | os.PathLike) -> str:
    """A SHA-256 of what a dataset directory holds, without reading its data: the group's and each
    array's zarr.json bytes, and every chunk file's relative path, size and mtime (ns).

    Re-ingesting a dataset under the same path and shape rewrites its chunk files (new mtimes,
    usually new sizes), so the fingerprint changes: a resumable job keyed on it never mixes the
    old content with the new."""
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
