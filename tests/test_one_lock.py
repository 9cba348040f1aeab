"""One lock (jepa_cli/data/locks.py) behind the run directory, the partial outputs and the output
folders; and one conversion of values into JSON data (jepa_cli/data/jsonvalues.py)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from jepa_cli.data import locks
from jepa_cli.data.jsonvalues import json_value
from jepa_cli.errors import InputError
from jepa_cli.training.runfiles import run_lock, write_run


# --- the lock ----------------------------------------------------------------------------------------

def test_a_held_run_lock_refuses_a_second_holder_naming_the_pid_and_the_run(tmp_path):
    with run_lock(tmp_path).held():
        with pytest.raises(InputError) as refused:
            run_lock(tmp_path).acquire()
    assert str(refused.value) == (f"{tmp_path}: another process (pid {os.getpid()}) is training in this run; "
                                  "wait for it to finish or stop it")


def test_a_run_lock_file_holds_the_holders_pid_and_goes_with_the_release(tmp_path):
    lock = run_lock(tmp_path)
    assert lock.acquire() is True
    assert (tmp_path / ".lock").read_text() == f"{os.getpid()}\n"
    lock.release()
    assert list(tmp_path.iterdir()) == []


def test_holder_names_the_pid_while_held_and_none_after(tmp_path):
    lock = run_lock(tmp_path)
    with lock.held():
        assert run_lock(tmp_path).holder() == str(os.getpid())
    assert run_lock(tmp_path).holder() is None


def test_holder_looks_without_creating_anything(tmp_path):
    assert run_lock(tmp_path).holder() is None
    assert locks.make_lock(tmp_path / "absent").holder() is None
    assert list(tmp_path.iterdir()) == []


def test_a_locked_directory_is_refused_and_its_holder_is_unknown(tmp_path):
    with locks.make_lock(tmp_path).held():
        assert locks.make_lock(tmp_path).holder() == "unknown"
        with pytest.raises(InputError, match=f"^{tmp_path}: another process \\(pid unknown\\) holds it"):
            locks.make_lock(tmp_path).acquire()
    assert locks.make_lock(tmp_path).holder() is None


def test_a_lock_file_left_by_a_dead_holder_is_no_lock(tmp_path):
    (tmp_path / ".lock").write_text("999999\n")  # what a holder killed with SIGKILL leaves
    with run_lock(tmp_path).held():
        assert (tmp_path / ".lock").read_text() == f"{os.getpid()}\n"


def test_held_releases_when_its_block_fails(tmp_path):
    with pytest.raises(RuntimeError):
        with locks.make_lock(tmp_path).held():
            raise RuntimeError("the block failed")
    assert locks.make_lock(tmp_path).acquire() is True


def test_a_waiting_lock_takes_the_file_there_now_not_the_one_its_holder_removed(tmp_path):
    first = run_lock(tmp_path)
    first.acquire()
    second = run_lock(tmp_path)
    taken = threading.Event()
    waiter = threading.Thread(target=lambda: (second.acquire(wait=True), taken.set()))
    waiter.start()
    time.sleep(0.2)  # the waiter has opened the file and waits in flock
    assert not taken.is_set()
    first.release()  # removes RUN/.lock, then unlocks: the waiter's file is gone
    assert taken.wait(5)
    waiter.join()
    assert (tmp_path / ".lock").read_text() == f"{os.getpid()}\n"
    assert run_lock(tmp_path).holder() == str(os.getpid())  # the file at the path is the one held
    second.release()


def test_a_file_system_without_locks_goes_on_unlocked(tmp_path, monkeypatch):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "no locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with locks.make_lock(tmp_path).held() as locked:
        assert locked is False
    with locks.resumable_partial(tmp_path / ".o.partial", tmp_path / "o") as partial:
        assert partial.is_dir()


def test_a_second_writer_of_a_partial_output_is_refused_naming_both(tmp_path):
    partial, final = tmp_path / ".o.partial", tmp_path / "o"
    with locks.resumable_partial(partial, final):
        with pytest.raises(InputError) as refused:
            with locks.resumable_partial(partial, final):
                pass
    assert str(refused.value) == (f"{final}: another process is writing it now (its partial output {partial} is "
                                  "in use); wait for it to finish, or write to another output")
    with locks.resumable_partial(partial, final):  # released: free again
        pass


def test_a_partial_output_behind_a_symbolic_link_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / ".o.partial").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(InputError, match="is not a partial output"):
        with locks.resumable_partial(tmp_path / ".o.partial", tmp_path / "o"):
            pass


@pytest.mark.slow
def test_a_lock_goes_with_its_holder_killed_by_sigkill(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; from jepa_cli.data.locks import make_lock; "
                               f"make_lock({str(tmp_path)!r}).acquire(); print('locked', flush=True); time.sleep(600)"],
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout.readline() == b"locked\n"
        assert locks.make_lock(tmp_path).holder() == "unknown"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert locks.make_lock(tmp_path).acquire() is True


# --- one JSON encoder ----------------------------------------------------------------------------------

def test_non_finite_floats_become_null_wherever_they_are():
    value = {"a": float("nan"), "b": (1.5, float("inf")), "c": [[float("-inf")]], "d": "NaN"}
    assert json_value(value) == {"a": None, "b": [1.5, None], "c": [[None]], "d": "NaN"}


def test_numpy_arrays_and_scalars_become_plain_lists_and_numbers():
    value = {"m": np.array([[1, 2], [3, 4]], np.int64), "f": np.float32(0.5), "n": np.float64("nan"),
             "i": np.int64(7), "b": np.bool_(True), "v": np.array([np.inf, 2.0])}
    out = json_value(value)
    assert out == {"m": [[1, 2], [3, 4]], "f": 0.5, "n": None, "i": 7, "b": True, "v": [None, 2.0]}
    assert [type(out[k]) for k in ("f", "i", "b")] == [float, int, bool]


def test_keys_become_text_as_json_writes_them_and_other_values_their_str():
    assert json_value({3: "three", False: "no", None: 0, 2.5: "x", "p": Path("a/b")}) == \
        {"3": "three", "false": "no", "null": 0, "2.5": "x", "p": "a/b"}


def test_the_result_is_strict_json_and_reads_back_equal():
    value = {"loss": float("nan"), "shape": (2, 3), "w": np.zeros(2, np.float32)}
    text = json.dumps(json_value(value), allow_nan=False)
    assert text == '{"loss": null, "shape": [2, 3], "w": [0.0, 0.0]}'
    assert json.loads(text) == json_value(value)


def test_run_json_holds_null_for_a_non_finite_number(tmp_path):
    write_run(tmp_path, {"config": {"lr": float("inf")}, "lengths": {"steps": (4,)}})
    assert json.loads((tmp_path / "run.json").read_text()) == {"config": {"lr": None}, "lengths": {"steps": [4]}}
