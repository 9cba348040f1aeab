"""Atomic outputs: a directory or file is written beside its final path and renamed into place
only when complete, never over something it did not create (docs/formats.md). An interrupted or
failed write leaves no output behind and never damages an existing one.

An output in a bucket (s3://, gs://) is written to a local staging folder and published
(`buckets.publish`): the objects first, the group's zarr.json last, since an object store has no
rename; a prefix without that zarr.json is an interrupted write, cleared by the next write. Its
writer holds the output's lease (`locks.LeaseLock`) from before the staging until the publication
ends, so two writers on any hosts never write one output together."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from jepa_cli.data import buckets
from jepa_cli.data.locks import make_lock, this_process_lease
from jepa_cli.data.store import check_utf8, read_attributes
from jepa_cli.data.urls import BucketPath, location
from jepa_cli.errors import InputError, note_completed, raise_if_signalled_since, sigterm_raises, signal_mark

PARTIAL_PREFIX = ".{name}.partial-"  # + 8 hex digits: the temporary sibling of an atomic write
AT_FDCWD, RENAME_NOREPLACE = -100, 1  # linux/fcntl.h, linux/fs.h


def check_output(path: str | os.PathLike | BucketPath, force: bool, kind: str,
                 inputs: Iterable[str | os.PathLike | BucketPath] = ()) -> Path | BucketPath:
    """Refuses an output that would destroy data; returns the path (a local Path or a BucketPath).

    Refused: an output that is, contains or lies inside one of `inputs` (symlinks and relative
    paths resolved); an existing output without `force`; with `force`, anything but a jepa
    artifact of the same `kind` (its `jepa_kind`), e.g. a user's folder, a file or a run.
    """
    path = location(path)
    if isinstance(path, BucketPath):
        _check_bucket_output(path, force, kind, inputs)
        return path
    check_disjoint(path, inputs)
    check_utf8(path)
    if not path.parent.is_dir():
        raise InputError(f"{path.parent}: output directory does not exist")
    if os.path.lexists(path):
        check_replaceable(path, kind)  # first: suggest --force only where it would work
        if not force:
            raise InputError(f"{path}: already exists (use --force to overwrite)")
    return path

def _check_bucket_output(url: BucketPath, force: bool, kind: str,
                         inputs: Iterable[str | os.PathLike | BucketPath]) -> None:
    """check_output for a bucket prefix: also refused when the bucket does not exist or the
    credentials are refused (`buckets.keys` asks the store), and when the prefix holds an object jepa
    does not write. Objects without a group zarr.json (an interrupted write) pass: publishing clears them."""
    for given in inputs:
        source = location(given)
        if isinstance(source, BucketPath) and (source.scheme, source.bucket) == (url.scheme, url.bucket):
            out_parts, in_parts = url.key.split("/"), source.key.split("/")
            relation = ("is the input" if out_parts == in_parts else
                        "lies inside the input" if out_parts[:len(in_parts)] == in_parts else
                        "contains the input" if in_parts[:len(out_parts)] == out_parts else None)
            if relation:
                raise InputError(f"{url}: the output {relation} {given}; choose an output outside every input")
    found = buckets.keys(url)
    foreign = next((key for key in found if not _jepa_key(key)), None)
    if foreign is not None:
        raise InputError(f"{url}: holds {url / foreign}, which jepa did not write; choose another output")
    if buckets.GROUP_METADATA not in found:
        return
    try:
        existing = read_attributes(url).get("jepa_kind")
    except InputError:
        existing = None
    if existing != kind:
        what = f"holds jepa_kind {existing!r}" if isinstance(existing, str) else "is not a jepa output (no jepa_kind)"
        raise InputError(f"{url}: {what}; --force replaces only an output of the same kind (jepa_kind {kind!r}); "
                         "remove it yourself or choose another output")
    if not force:
        raise InputError(f"{url}: already exists (use --force to overwrite)")

def _jepa_key(key: str) -> bool:
    """Whether `key` (relative to an artifact's prefix) is one jepa writes: a node's zarr.json, a
    chunk in a node's `c/` named by decimal chunk indices, or `c`, a zero-dimensional array's chunk."""
    *folder, name = key.split("/")
    return name in (buckets.GROUP_METADATA, "c") or (_in_chunk_folder(tuple(folder)) and name.isascii()
                                                      and name.isdecimal())

def check_disjoint(output: str | os.PathLike, inputs: Iterable[str | os.PathLike]) -> None:
    """InputError if `output` is, contains or lies inside one of `inputs` (writing it would delete
    or mix into an input)."""
    out = Path(output).resolve()
    for given in inputs:
        if isinstance(location(given), BucketPath):
            continue  # a bucket never overlaps a local output
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
    foreign = foreign_entry(path)
    if foreign is not None:
        raise InputError(f"{shown}: holds {foreign}, which jepa did not write; --force replaces only what jepa "
                         "wrote: move that file out first, or choose another output")

def foreign_entry(path: str | os.PathLike) -> Path | None:
    """The first entry under the zarr v3 hierarchy `path` (a dataset, an embedding set, a mask file)
    that jepa does not write there, or None. jepa writes only folders of nodes, each with its
    `zarr.json`, and chunk files under a node's `c/` folder named by decimal chunk indices (zarr v3's
    default chunk key encoding); a symbolic link is never jepa's."""
    path = Path(path)
    for folder, dirs, files in os.walk(path):  # does not follow links: a linked folder is listed, not entered
        here = Path(folder)
        chunks = _in_chunk_folder(here.relative_to(path).parts)
        for name in sorted(dirs + files):
            entry = here / name
            if entry.is_symlink():
                return entry
            if chunks:
                written = name.isascii() and name.isdecimal()
            elif name in dirs:
                written = name == "c" and (here / "zarr.json").is_file() or (entry / "zarr.json").is_file()
            else:  # "c": the one chunk of a zero-dimensional array
                written = name == "zarr.json" or name == "c" and (here / "zarr.json").is_file()
            if not written:
                return entry
    return None

def _in_chunk_folder(parts: tuple[str, ...]) -> bool:
    """Whether the folder at `parts` (relative to the hierarchy's root) lies in a node's `c/` chunk
    folder: a `c` followed only by decimal chunk indices."""
    if "c" not in parts:
        return False
    tail = parts[len(parts) - parts[::-1].index("c"):]
    return all(p.isascii() and p.isdecimal() for p in tail)

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
    if isinstance(final, BucketPath):
        with _bucket_staging(final, force, kind) as tmp:
            yield tmp
        return
    tmp = final.with_name(f"{PARTIAL_PREFIX.format(name=final.name)}{uuid.uuid4().hex[:8]}")
    lock = make_lock(tmp)
    mark = signal_mark()
    try:
        with sigterm_raises():  # before mkdir: a signal right after it still removes the partial
            with make_lock(final.parent).held(wait=True):
                for message in remove_stale_partials(final):
                    if log:
                        log(message)
                tmp.mkdir()
                lock.acquire()
            yield tmp
            raise_if_signalled_since(mark)  # a signal whose exception a callback swallowed: never commit
            move_into_place(tmp, final, force, kind)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        lock.release()

@contextlib.contextmanager
def _bucket_staging(final: BucketPath, force: bool, kind: str) -> Iterator[Path]:
    """atomic_directory for a bucket output: holds its lease (InputError naming the holder when another
    process writes it), yields a fresh local staging folder and publishes it to `final`
    (`move_into_place`) only if the block succeeds; the folder is removed either way."""
    mark = signal_mark()
    tmp = None
    try:
        with sigterm_raises(), make_lock(final).held():
            tmp = Path(tempfile.mkdtemp(prefix=f"{final.name}.", dir=buckets.staging_root()))
            yield tmp
            raise_if_signalled_since(mark)
            move_into_place(tmp, final, force, kind)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

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
            # refused (InputError): a live writer holds it; not locked: the file system cannot tell; kept
            with contextlib.suppress(InputError, OSError), make_lock(entry).held() as locked:
                if locked:
                    shutil.rmtree(entry, ignore_errors=True)
                    messages.append(f"removed {entry}, left by an interrupted write whose process is gone")
        elif swapped.fullmatch(entry.name) and final.is_dir() and _jepa_kind(entry) is not None:
            shutil.rmtree(entry, ignore_errors=True)
            messages.append(f"removed {entry}, an output replaced by an interrupted --force write")
    return messages

def move_into_place(tmp: Path, final: Path | BucketPath, force: bool, kind: str) -> None:
    """Renames the finished directory `tmp` to `final`, never over something that appeared meanwhile.

    Without `force` an existing `final` is an InputError (the check and the rename are one atomic
    step, so of two concurrent writers exactly one wins). With `force` an existing `final` is
    checked again (`check_replaceable`, at move time), swapped out, and removed once `tmp` is in place.

    A bucket `final` is published under its lease: this process's (taken by `atomic_directory` or
    `locks.resumable_partial`), else one taken for the publication (InputError naming the holder when
    another process holds it). It is checked again (`check_output`), the lease confirmed, cleared of
    what was there (an interrupted write's objects, or with `force` the output it replaces), published
    from `tmp` with the lease confirmed again before the commit, and `tmp` removed. A lease lost
    meanwhile (expired and taken over) publishes nothing.
    """
    if isinstance(final, BucketPath):
        own = this_process_lease(final)
        lease = own or make_lock(final)
        with contextlib.nullcontext() if own else lease.held():
            check_output(final, force, kind)
            lease.confirm()
            buckets.clear(final)
            buckets.publish(tmp, final, before_commit=lease.confirm)
        note_completed(final)
        shutil.rmtree(tmp, ignore_errors=True)
        if tmp.parent != buckets.staging_root():  # a resumable partial's own staging folder
            shutil.rmtree(tmp.parent, ignore_errors=True)
        return
    try:
        rename_no_replace(tmp, final)
        note_completed(final)
        return
    except FileExistsError:
        if not force:
            raise InputError(f"{final}: already exists (another process wrote it while this command ran)") from None
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

def check_output_file(path: str | os.PathLike, force: bool, magic: bytes, what: str,
                      inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Refuses a file output that would destroy data; returns the path. An output inside one of
    `inputs` is refused (`check_disjoint`); an existing path is refused without `force`, and with
    `force` unless it is a regular file starting with `magic` (a `what`, e.g. "PNG picture"): a
    user's other file, a directory or a symbolic link is never replaced. A bucket URL is refused:
    single files are written to local paths only."""
    if isinstance(location(path), BucketPath):
        raise InputError(f"{path}: a {what} is written to a local path only, not to a bucket")
    path = Path(path)
    check_disjoint(path, inputs)
    check_utf8(path)
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
    try:
        with sigterm_raises():
            try:
                tmp.write_bytes(data)
            except OSError as exc:  # named as the user gave it, not as the hidden temporary file
                reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
                raise InputError(f"{path}: cannot write a file in {path.parent} ({reason})") from None
            raise_if_signalled_since(mark)
            try:
                rename_no_replace(tmp, path)
            except FileExistsError:
                if not force:
                    raise InputError(f"{path}: already exists (another process wrote it while this command "
                                     "ran)") from None
                _check_replaceable_file(path, magic, what)
                os.replace(tmp, path)
            note_completed(path)
    finally:
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
    with make_lock(Path(dst).parent).held(wait=True):
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
