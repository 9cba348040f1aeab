"""Hostile-user cases for what `--force` may replace and where outputs may go, through the real CLI:
a run a live trainer holds, a run another trainer wrote meanwhile, a symbolic link, a user's file
inside an output, an output inside an input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from adversarial import HELD, assert_one_error_line, expect_refusal, jepa_env, release_held, run_jepa
from test_adversarial_train import finished_run, toy_data  # noqa: F401 - fixtures: a 4-step toy run, its data
from test_encode import trained as run_and_data  # noqa: F401 - a fixture: one tiny I-JEPA run at step 0

from jepa_cli.data import store

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent
TOY_ENV = {"PYTHONPATH": str(TESTS)}  # toy_objective importable in the subprocess
TOY = ["--objective", "toy_objective:make", "--mesh", "data=1", "--batch-size", "16", "--warmup-steps", "1"]


def _held(marker: Path, target: str, *args) -> subprocess.Popen:
    """`jepa ARGS` (the toy objective importable) held before `target` ('module:function') runs, until
    `release_held(marker)`; it may also exit before it gets there."""
    module, attribute = target.split(":")
    return subprocess.Popen([sys.executable, "-c", HELD, str(marker), module, attribute, "before", *map(str, args)],
                            env=jepa_env(TOY_ENV), stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_held(process: subprocess.Popen, marker: Path) -> bool:
    """True once `process` waits at `marker`, False if it exited first."""
    deadline = time.monotonic() + 240
    while not marker.exists():
        if process.poll() is not None:
            return False
        assert time.monotonic() < deadline, "the held process never got there"
        time.sleep(0.02)
    return True


def _steps(run: Path) -> int:
    return json.loads((run / "run.json").read_text())["lengths"]["steps"]


def test_force_while_a_live_trainer_holds_the_run_is_refused_and_the_live_run_is_kept(finished_run, toy_data,
                                                                                       tmp_path):
    live = _held(tmp_path / "live", "jepa_cli.training.loop:_train_locked", "train", *TOY, "--data", toy_data,
                 "--out", finished_run, "--steps", "6", "--resume", "-q")
    try:
        assert _wait_held(live, tmp_path / "live"), live.communicate()
        # the second trainer is held where it locks RUN: the live run must be refused before that
        second = _held(tmp_path / "second", "jepa_cli.training.rundir:lock_run", "train", *TOY, "--data", toy_data,
                       "--out", finished_run, "--steps", "2", "--force", "-q")
        reached_lock = _wait_held(second, tmp_path / "second")
        release_held(tmp_path / "live")
        assert live.wait(timeout=240) == 0, live.communicate()
        release_held(tmp_path / "second")
        second.wait(timeout=240)
        assert not reached_lock
        assert_one_error_line(subprocess.CompletedProcess([], second.returncode, *second.communicate()), 2,
                              [str(finished_run), "another process (pid", "is training in this run"])
    finally:
        for process in (live, locals().get("second")):
            if process is not None and process.poll() is None:
                process.kill()
    assert _steps(finished_run) == 6  # the live run's, not the --force's 2


def test_force_refuses_a_run_another_trainer_wrote_after_it_looked(finished_run, toy_data, tmp_path):
    replacing = _held(tmp_path / "held", "jepa_cli.training.rundir:lock_run", "train", *TOY, "--data", toy_data,
                      "--out", finished_run, "--steps", "2", "--force", "-q")
    try:
        assert _wait_held(replacing, tmp_path / "held"), replacing.communicate()
        resumed = run_jepa("train", *TOY, "--data", toy_data, "--out", finished_run, "--steps", "6", "--resume", "-q",
                           env=TOY_ENV, timeout=240)
        assert resumed.returncode == 0, resumed.stderr
        release_held(tmp_path / "held")
        replacing.wait(timeout=240)
    finally:
        if replacing.poll() is None:
            replacing.kill()
    assert_one_error_line(subprocess.CompletedProcess([], replacing.returncode, *replacing.communicate()), 2,
                          [str(finished_run), "another process wrote a run here meanwhile"])
    assert _steps(finished_run) == 6
    assert sorted(int(p.name) for p in (finished_run / "checkpoints").iterdir()) == [2, 4, 6]  # --keep 3


def test_force_through_a_symbolic_link_is_refused_and_the_run_behind_it_kept(finished_run, toy_data, tmp_path):
    link = tmp_path / "r"
    link.symlink_to(finished_run)
    expect_refusal("train", *TOY, "--data", toy_data, "--out", link, "--steps", "1", "--force", env=TOY_ENV,
                   guard=[finished_run, link], fragments=[str(link), "symbolic link"])


def test_force_refuses_a_run_whose_checkpoints_folder_holds_a_users_file(finished_run, toy_data):
    notes = finished_run / "checkpoints" / "NOTES.txt"
    notes.write_text("mine")
    expect_refusal("train", *TOY, "--data", toy_data, "--out", finished_run, "--steps", "1", "--force", env=TOY_ENV,
                   guard=[finished_run], fragments=[str(notes), "jepa train did not write"])


def test_force_still_replaces_a_run_jepa_wrote(finished_run, toy_data):
    result = run_jepa("train", *TOY, "--data", toy_data, "--out", finished_run, "--steps", "2", "--force", "-q",
                      env=TOY_ENV, timeout=240)
    assert result.returncode == 0, result.stderr
    assert _steps(finished_run) == 2
    assert sorted(p.name for p in (finished_run / "checkpoints").iterdir()) == ["2"]


def test_export_into_a_checkpoint_of_its_run_is_refused(run_and_data):
    run, _ = run_and_data
    expect_refusal("export", run, "-o", run / "checkpoints" / "0" / "enc.safetensors", guard=[run],
                   fragments=["enc.safetensors", "lies inside the input", str(run)])


def test_encode_latents_into_its_run_is_refused(run_and_data):
    run, data = run_and_data
    expect_refusal("encode-latents", run, data, "-o", run / "e.zarr", "--mesh", "data=1", guard=[run, data],
                   fragments=["e.zarr", "lies inside the input", str(run)])


def test_ingest_force_refuses_a_dataset_holding_a_users_file_and_names_it(tmp_path):
    source = tmp_path / "x.npy"
    np.save(source, np.zeros((4, 8, 8, 1), np.uint8))
    out = tmp_path / "x.zarr"
    assert run_jepa("ingest", source, out, "-q").returncode == 0
    notes = out / "MY_NOTES.txt"
    notes.write_text("mine")
    expect_refusal("ingest", source, out, "--force", guard=[tmp_path], fragments=[str(notes), "jepa did not write"])


def test_a_file_in_a_chunk_folder_that_is_no_chunk_index_is_foreign(tmp_path):
    """The rule behind --force's refusal, on a dataset: zarr.json and decimal chunk indices are
    jepa's, a name of other characters inside the chunk folder is not."""
    from jepa_cli.data.atomic import foreign_entry

    out = tmp_path / "d.zarr"
    store.write_group(out, store.base_attributes("dataset", modality="image", layout="NHWC", class_names=[]))
    store.write_array(out / "inputs", np.ones((4, 2, 2, 1), np.uint8))
    assert foreign_entry(out) is None
    chunk = next(p for p in (out / "inputs" / "c").rglob("*") if p.is_file())
    stray = chunk.with_name(chunk.name + ".bak")
    shutil.copy(chunk, stray)
    assert foreign_entry(out) == stray
    stray.unlink()
    os.symlink(chunk, chunk.with_name("9"))
    assert foreign_entry(out) == chunk.with_name("9")
