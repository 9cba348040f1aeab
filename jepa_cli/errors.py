"""Errors that end a command with one line on stderr instead of a traceback, and the signals that
end one: every SIGINT/SIGTERM handler of the package is installed here.

Library code raises these; the CLI turns them into `jepa: error: ...` and the exit code.
"""

import contextlib
import errno
import os
import re
import signal
import threading
from typing import Any, Callable, Iterator


class JepaError(Exception):
    """A failure while running (exit code 1)."""

    exit_code = 1


class InputError(JepaError):
    """Bad usage or bad input: a missing file, a wrong shape, an inconsistent option (exit code 2)."""

    exit_code = 2


class Terminated(KeyboardInterrupt):
    """SIGTERM turned into an exception so that cleanup runs as for Ctrl-C; the CLI exits 143 (128 + 15)."""


_received: list[int] = []  # signal numbers that reached the handlers below, in order
_deferring = [0]  # > 0 inside `signals_deferred`: the handlers below record and return


def raise_terminated(signum, frame) -> None:
    """A SIGTERM handler: raises Terminated in the main thread (records it only inside `signals_deferred`)."""
    _received.append(signum)
    if not _deferring[0]:
        raise Terminated


def raise_interrupted(signum, frame) -> None:
    """A SIGINT handler: raises KeyboardInterrupt, as Python's own, and remembers the signal (records it
    only inside `signals_deferred`)."""
    _received.append(signum)
    if not _deferring[0]:
        raise KeyboardInterrupt


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Inside the block SIGINT/SIGTERM are recorded, not raised (`raise_if_signalled_since` raises them
    after it): for a call whose result must not be lost, such as the future of a write it starts."""
    _deferring[0] += 1
    try:
        yield
    finally:
        _deferring[0] -= 1


def raise_on_signals() -> None:
    """From now on SIGTERM raises Terminated and SIGINT KeyboardInterrupt, both recorded (`signal_mark`),
    so that cleanup runs as for Ctrl-C; a SIGINT the parent process ignores stays ignored. Main thread
    only (Python runs handlers there alone); elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, raise_terminated)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, raise_interrupted)


def ignore_signals() -> None:
    """From now on SIGINT and SIGTERM are ignored (a process whose outcome is settled)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


@contextlib.contextmanager
def signals_handled(handler: Callable[[int, Any], None],
                    signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Inside the block `handler(signum, frame)` handles the signals `signums`; the handlers before are
    restored as the block ends, however it ends. Main thread only: elsewhere the block runs with the
    handlers as they are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, handler) for signum in signums}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def sigterm_raises() -> contextlib.AbstractContextManager[None]:
    """Inside the block SIGTERM raises Terminated (a KeyboardInterrupt), so that the block's cleanup runs."""
    return signals_handled(raise_terminated, (signal.SIGTERM,))


class StopRequest:
    """A handler for `signals_handled` that asks a long job to stop at its next safe point instead of
    raising: the first SIGINT/SIGTERM is remembered (`signal`, its name, e.g. "SIGTERM"); a second
    raises at once (Terminated or KeyboardInterrupt)."""

    def __init__(self) -> None:
        self.signal: str | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        if self.signal is not None:  # a second signal: stop now, without waiting for the safe point
            raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt
        self.signal = signal.Signals(signum).name


def signal_mark() -> int:
    """A bookmark in the signals received so far, for `raise_if_signalled_since`."""
    return len(_received)


def raise_if_signalled_since(mark: int) -> None:
    """Raises Terminated (SIGTERM) or KeyboardInterrupt (SIGINT) if a signal reached the handlers after
    `mark`. A handler's exception is lost when the signal lands inside a callback whose errors Python
    only prints ("Exception ignored in": JAX's garbage-collection hook, a __del__); the work then goes
    on, and this check before a commit point still stops it."""
    received = _received[mark:]
    if not received:
        return
    if signal.SIGTERM in received:
        raise Terminated
    raise KeyboardInterrupt


_completed: list[str] = []  # outputs moved into place in full, in order


def note_completed(path) -> None:
    """Records an output now in place in full, so that a signal stopping the command afterwards says
    the output is complete (only what came after it was cut short)."""
    _completed.append(str(path))


def completed_mark() -> int:
    """A bookmark in the completed outputs so far, for `completed_since`."""
    return len(_completed)


def completed_since(mark: int) -> list[str]:
    """The outputs moved into place in full after `mark`."""
    return _completed[mark:]


def received_signal(since: int = 0) -> int | None:
    """The last SIGINT/SIGTERM number the handlers saw after the bookmark `since` (`signal_mark`), else
    None. A signal landing inside a C extension's import turns into an ImportError that no longer says
    it was a signal; this does."""
    return _received[-1] if _received[since:] else None


def out_of_memory(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from or while handling, is the process running out of
    memory: a MemoryError (an address-space limit, `ulimit -v`), a thread the system could not start
    (its stack is memory too) or XLA failing to allocate (RESOURCE_EXHAUSTED)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = str(exc)
        if (isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and "can't start new thread" in text)
                or ("RESOURCE_EXHAUSTED" in text and "memory" in text.lower())):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


# The file system refusing a read or a write: a full disk or quota, no permission, a read-only mount,
# a name too long, a file over the size limit, a file where a path needs a folder (or the reverse), a
# loop of symbolic links. The user fixes these, not the program (exit code 2).
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS,
                            errno.ENAMETOOLONG, errno.EFBIG, errno.ENOTDIR, errno.EISDIR, errno.ELOOP})
# TensorStore (zarr arrays, orbax checkpoints) reports the errno in its text, and the path in quotes before it
_TENSORSTORE_ERRNO = re.compile(r"\[os_error_code='?(\d+)'?\]")


def storage_failure(exc: BaseException | None, where: str | os.PathLike | None = None) -> str | None:
    """`PATH: no space left on device` (the path the error names, else `where`) when `exc`, or an
    exception it was raised from or while handling, is the file system refusing (STORAGE_ERRNOS);
    None for anything else."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        code, path = None, None
        if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
            code, path = exc.errno, exc.filename
        else:
            text = str(exc)
            match = _TENSORSTORE_ERRNO.search(text)
            if match and int(match.group(1)) in STORAGE_ERRNOS:
                code = int(match.group(1))
                quoted = re.findall(r'"([^"\\]+)"', text[:match.start()].split("tensorstore_spec")[0])
                path = quoted[-1] if quoted else None
        if code is not None:
            path = path if path is not None else where
            reason = os.strerror(code).lower()
            return f"{os.fsdecode(path)}: {reason}" if path is not None else reason
        exc = exc.__cause__ or exc.__context__
    return None
