"""Directory locks: flock(2) on a directory's descriptor, which the kernel drops when the process
dies (SIGKILL included), so a lock never outlives its holder. They serialise jepa writers in one
output folder and tell a live writer's partial output from one a dead writer left behind."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator

from jepa_cli.errors import InputError


def lock_directory(path: Path) -> int | None:
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
def directory_lock(path: Path) -> Iterator[None]:
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
    with directory_lock(partial.parent):
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
        except OSError:  # a file system without locks: proceed unlocked, as directory_lock does
            pass
        yield partial
    finally:
        os.close(fd)
