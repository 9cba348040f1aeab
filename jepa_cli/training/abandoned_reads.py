"""The reads a failed checkpoint restore leaves behind: when one read of a damaged checkpoint fails,
orbax leaves its other reads in flight, and Python would print their tracebacks around the command's
one error line (training/checkpoint.py reports the failure once, as an UnreadableCheckpoint).
`silence_abandoned_reads` drops exactly those tracebacks; `settle_abandoned_reads_at_exit` lets the
stray reads end before the interpreter shuts down."""

from __future__ import annotations

_silenced = False
_settling = False


def silence_abandoned_reads() -> None:
    """When one read of a damaged checkpoint fails, orbax leaves its other reads in flight; when
    they fail too, or complete after orbax closed their event loop, Python prints their tracebacks
    on stderr (asyncio's log, the unraisable hook, the except hook) around the command's one error
    line. The failure is reported once, as an UnreadableCheckpoint: drop exactly those tracebacks
    (errors raised in orbax's code, and "Event loop is closed") for the rest of the process. Installed
    before the first read, since a stray traceback can come from another thread at once."""
    import logging
    import sys

    global _silenced
    if _silenced:
        return
    _silenced = True

    def from_orbax(tb) -> bool:
        while tb is not None:
            if "orbax" in tb.tb_frame.f_code.co_filename:
                return True
            tb = tb.tb_next
        return False

    def loop_closed(exc) -> bool:
        return isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"

    def stray(exc) -> bool:
        # A read's error may carry no orbax frame (an awaited TensorStore future): its text names TensorStore.
        return exc is not None and (from_orbax(exc.__traceback__) or loop_closed(exc)
                                    or "tensorstore" in str(exc).lower())

    class _Filter(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not stray(record.exc_info[1] if record.exc_info else None)

    logging.getLogger("asyncio").addFilter(_Filter())
    unraisable, excepthook = sys.unraisablehook, sys.excepthook

    def on_unraisable(info) -> None:
        code = getattr(info.object, "cr_code", None)
        if not ((code is not None and "orbax" in code.co_filename) or stray(info.exc_value)):
            unraisable(info)

    def on_exception(kind, value, tb) -> None:
        if not (stray(value) or from_orbax(tb)):
            excepthook(kind, value, tb)

    sys.unraisablehook, sys.excepthook = on_unraisable, on_exception


def settle_abandoned_reads_at_exit() -> None:
    """After a failed read, gives the stray reads a moment at exit to end while the filters above
    still work (during the interpreter's shutdown Python prints with its default hooks)."""
    import atexit
    import time

    global _settling
    if not _settling:
        _settling = True
        atexit.register(time.sleep, 0.5)  # local reads end within milliseconds
