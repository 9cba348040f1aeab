"""Every SIGINT/SIGTERM handler of the package is installed through jepa_cli/errors.py: the handlers a
command runs under, the block where SIGTERM raises, the stop a trainer asks for, and signals deferred
while a publication must not be cut short."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from jepa_cli.data import atomic, store
from jepa_cli.errors import (StopRequest, Terminated, ignore_signals, raise_on_signals, raise_terminated,
                             signals_deferred, signals_handled, sigterm_raises)


@pytest.fixture(autouse=True)
def handlers_kept():
    """Puts the test process's own SIGINT/SIGTERM handlers back after each test."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def _record(seen: list[int]):
    return lambda signum, frame: seen.append(signum)


def test_signals_handled_installs_the_handler_for_the_block_only():
    seen: list[int] = []
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with signals_handled(_record(seen)):
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
    assert seen == [signal.SIGTERM, signal.SIGINT]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


def test_signals_handled_restores_the_handlers_when_the_block_fails():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with pytest.raises(RuntimeError):
        with signals_handled(_record([])):
            raise RuntimeError("the block failed")
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_signals_handled_outside_the_main_thread_leaves_the_handlers_as_they_are():
    before = signal.getsignal(signal.SIGTERM)
    ran: list[bool] = []

    def worker() -> None:
        with signals_handled(_record([])):
            ran.append(signal.getsignal(signal.SIGTERM) is before)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert ran == [True]


def test_a_stop_request_remembers_the_first_signal_and_raises_on_the_second():
    stop = StopRequest()
    with signals_handled(stop):
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signal == "SIGTERM"
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_second_sigint_raises_keyboard_interrupt_not_terminated():
    stop = StopRequest()
    with signals_handled(stop):
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signal == "SIGINT"
        with pytest.raises(KeyboardInterrupt) as raised:
            os.kill(os.getpid(), signal.SIGINT)
    assert type(raised.value) is KeyboardInterrupt


def test_sigterm_raises_terminated_inside_the_block_and_not_after():
    seen: list[int] = []
    signal.signal(signal.SIGTERM, _record(seen))
    with pytest.raises(Terminated):
        with sigterm_raises():
            os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
    assert seen == [signal.SIGTERM]


def test_a_command_runs_with_sigterm_raising_and_an_ignored_sigint_still_ignored():
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # e.g. started in the background by a shell
    raise_on_signals()
    assert signal.getsignal(signal.SIGTERM) is raise_terminated
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_command_turns_the_default_sigint_into_keyboard_interrupt():
    signal.signal(signal.SIGINT, signal.default_int_handler)
    raise_on_signals()
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)


def test_ignore_signals_ignores_both():
    ignore_signals()
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == [signal.SIG_IGN, signal.SIG_IGN]


def test_a_sigterm_deferred_during_a_publication_still_stops_it_before_the_commit(tmp_path):
    out = tmp_path / "d.zarr"
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with pytest.raises(Terminated):
        with atomic.atomic_directory(out, False, "dataset") as tmp:
            store.write_group(tmp, store.base_attributes("dataset"))
            with signals_deferred():  # a write that must not be cut short: the signal is only recorded
                os.kill(os.getpid(), signal.SIGTERM)
            assert (tmp / "zarr.json").is_file()  # the block went on
    assert list(tmp_path.iterdir()) == []  # never moved into place, and the partial removed
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # the handler before the publication is back
