"""Hostile environments for `jepa train` and every command: a disk that fills up while training, a
folder the user may not write, a name too long for the file system, and JAX/XLA environment
variables that JAX or XLA reject. Each ends in one `jepa: error:` line (exit 2) and leaves what was
there intact; a run stopped by a full disk continues with --resume once there is room.

The file system cases inject the refusal (tests run as root, where permissions do not refuse, and no
small file system can be mounted without privileges), except the name too long, which is real."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from adversarial import ROOT, expect_refusal, snapshot
from conftest import assert_user_error, file_size_limit

from jepa_cli.data import store
from jepa_cli.errors import storage_failure
from jepa_cli.training import checkpoint, run as run_lib

TOY = ["--objective", "toy_objective:make", "--mesh", "data=1", "--batch-size", "16", "--warmup-steps", "1"]
NO_SPACE = "no space left on device"


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("toy") / "toy.zarr"
    rng = np.random.default_rng(0)
    store.write_group(path, store.base_attributes("dataset", modality="image", layout="NHWC", class_names=[]))
    store.write_array(path / "inputs", rng.integers(0, 256, (64, 8, 8, 1), dtype=np.uint8))
    return path


def _train(run_cli, data: Path, run: Path, *extra: str):
    return run_cli("train", *TOY, "--data", str(data), "--out", str(run), "--save-every", "2",
                   "--no-async-checkpointing", "-q", *extra)


# ---- a disk that fills up while training ---------------------------------------------------------------

@pytest.mark.slow
def test_full_disk_while_logging_stops_in_one_line_and_marks_the_run_failed(run_cli, toy_data, tmp_path,
                                                                          monkeypatch):
    run = tmp_path / "run"
    write = run_lib.MetricsWriter.write

    def fill_up(self, row):
        if row["step"] >= 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        write(self, row)

    monkeypatch.setattr(run_lib.MetricsWriter, "write", fill_up)
    result = _train(run_cli, toy_data, run, "--steps", "6")
    # the row of step 3 is written once step 4 is dispatched (metrics are read one step late)
    assert_user_error(result, f"{run}: {NO_SPACE}", "training stopped at step 4",
                      f"the last good checkpoint is step 2 in {run}", "--resume")
    record = json.loads((run / "run.json").read_text())
    assert (record["status"], record["error"]) == ("failed at step 4", f"{run}: {NO_SPACE}")
    assert run_lib.checkpoint_steps(run) == [2]
    assert not (run / ".reserve").exists()


@pytest.mark.slow
def test_full_disk_while_saving_names_the_checkpoint_and_removes_its_partial(run_cli, toy_data, tmp_path,
                                                                            monkeypatch):
    run = tmp_path / "run"
    save = checkpoint.Checkpoints.save

    def fill_up(self, step, *args):
        if step < 4:
            return save(self, step, *args)
        partial = self.directory / f"{step}.orbax-checkpoint-tmp" / "state.orbax-checkpoint-tmp"
        partial.mkdir(parents=True)
        # TensorStore's words for it, as orbax raises them
        raise ValueError(f'RESOURCE_EXHAUSTED: Error writing local file "{partial}/_sharding": Failed writing: '
                         f'"{partial}/_sharding.__lock": Failed to write 4611 bytes to file 6: No space left on '
                         "device [os_error_code='28']")

    monkeypatch.setattr(checkpoint.Checkpoints, "save", fill_up)
    result = _train(run_cli, toy_data, run, "--steps", "6")
    assert_user_error(result, f"{run / 'checkpoints' / '4'}: {NO_SPACE}", "the last good checkpoint is step 2")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["2"]
    assert json.loads((run / "run.json").read_text())["status"] == "failed at step 4"


@pytest.mark.slow
def test_resume_after_a_full_disk_continues_from_the_last_good_checkpoint(run_cli, toy_data, tmp_path, monkeypatch):
    run = tmp_path / "run"
    with monkeypatch.context() as patch:
        write = run_lib.MetricsWriter.write
        patch.setattr(run_lib.MetricsWriter, "write", lambda self, row: (
            write(self, row) if row["step"] < 3 else (_ for _ in ()).throw(OSError(errno.ENOSPC, "full"))))
        assert _train(run_cli, toy_data, run, "--steps", "6").exit_code == 2
    result = _train(run_cli, toy_data, run, "--steps", "6", "--resume", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["checkpoints"] == [2, 4, 6]
    assert json.loads((run / "run.json").read_text())["status"] == "finished"
    assert [row["step"] for row in run_lib.read_metrics(run)] == [1, 2, 3, 4, 5, 6]


def test_a_tensorstore_error_names_its_path_and_errno():
    exc = ValueError('Error opening "zarr" driver: Failed writing: "/r/checkpoints/8/d/3f": Failed to write 207 '
                     "bytes to file 6: No space left on device [tensorstore_spec='{\"path\":\"x/\"}'] "
                     "[os_error_code='28']")
    assert storage_failure(exc) == f"/r/checkpoints/8/d/3f: {NO_SPACE}"


def test_an_error_raised_while_handling_a_full_disk_is_traced_to_it():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/r/metrics.jsonl")
        except OSError:
            raise RuntimeError("Event loop is closed")
    except RuntimeError as exc:
        assert storage_failure(exc) == f"/r/metrics.jsonl: {NO_SPACE}"


@pytest.mark.slow
def test_the_error_line_is_the_last_thing_on_stderr_even_at_exit(tmp_path):
    """A library's traceback printed while the interpreter shuts down (after the error line) is dropped."""
    script = ("import atexit, sys\n"
              "from jepa_cli.cli import main\n"
              "atexit.register(lambda: sys.stderr.write('a late traceback\\n'))\n"
              "main._fail('x: no space left on device', 2)\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, timeout=60)
    assert (result.returncode, result.stderr) == (2, b"jepa: error: x: no space left on device\n")


# ---- folders the user may not write, names too long ----------------------------------------------------

@pytest.mark.slow
def test_out_in_a_folder_without_write_permission_is_one_line(run_cli, toy_data, tmp_path, monkeypatch):
    run = tmp_path / "locked" / "run"
    run.parent.mkdir()
    mkdir = Path.mkdir

    def refuse(self, *args, **kwargs):
        if self == run:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refuse)
    before = snapshot([tmp_path])
    assert_user_error(_train(run_cli, toy_data, run, "--steps", "1"), f"{run}: permission denied")
    assert snapshot([tmp_path]) == before


@pytest.mark.slow
def test_out_with_a_name_too_long_is_one_line(run_cli, toy_data, tmp_path):
    run = tmp_path / ("r" * 300)
    before = snapshot([tmp_path])
    assert_user_error(_train(run_cli, toy_data, run, "--steps", "1"), f"{run}: file name too long")
    assert snapshot([tmp_path]) == before


@pytest.mark.slow
def test_tensorboard_with_a_name_too_long_is_refused_before_run_is_created(run_cli, toy_data, tmp_path):
    board = tmp_path / ("t" * 300)
    before = snapshot([tmp_path])
    assert_user_error(_train(run_cli, toy_data, tmp_path / "run", "--steps", "1", "--tensorboard", str(board)),
                      f"{board}: file name too long")
    assert snapshot([tmp_path]) == before


@pytest.mark.slow
def test_mask_output_with_a_name_too_long_is_one_line(run_cli, tmp_path):
    out = tmp_path / ("m" * 300 + ".zarr")
    assert_user_error(run_cli("mask", "--grid", "8x8", "--batch-size", "2", "-o", str(out)), "file name too long")


# ---- JAX and XLA environment variables ------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("command", [["mask", "--grid", "8x8"], ["train", *TOY, "--steps", "1"]], ids=["mask", "train"])
def test_an_unknown_xla_flag_is_one_line_before_xla_starts(command, toy_data, tmp_path):
    args = [*command, "--data", toy_data, "--out", tmp_path / "run"] if command[0] == "train" else command
    expect_refusal(*args, guard=[tmp_path], env={"XLA_FLAGS": "--bogus"},
                   fragments=["XLA_FLAGS='--bogus'", "Unknown flag in XLA_FLAGS: --bogus"])


@pytest.mark.slow
def test_an_xla_flag_value_xla_cannot_read_is_one_line(tmp_path):
    flags = "--xla_force_host_platform_device_count=abc"
    expect_refusal("mask", "--grid", "8x8", guard=[tmp_path], cwd=tmp_path, env={"XLA_FLAGS": flags},
                   fragments=[f"XLA_FLAGS='{flags}'", "Couldn't interpret value abc"])


def test_known_xla_flags_are_not_checked_in_a_child_process(monkeypatch):
    from jepa_cli.cli import main

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("a child process was started"))
    assert main.xla_flags_problem({"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}) is None


@pytest.mark.slow
@pytest.mark.parametrize("command", [["env"], ["train", *TOY, "--steps", "1"]], ids=["env", "train"])
def test_a_jax_variable_jax_cannot_read_is_one_line_naming_it(command, toy_data, tmp_path):
    args = [*command, "--data", toy_data, "--out", tmp_path / "run"] if command[0] == "train" else command
    expect_refusal(*args, guard=[tmp_path], env={"JAX_NUM_CPU_DEVICES": "abc", "PYTHONPATH": str(ROOT / "tests")},
                   fragments=["JAX_NUM_CPU_DEVICES='abc'", "jax_num_cpu_devices"])


@pytest.mark.slow
def test_a_full_disk_while_resuming_leaves_metrics_and_no_partial_copy(tmp_path, monkeypatch):
    from jepa_cli.training import rundir

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n{"step": 2}\n')

    with pytest.raises(OSError):  # the disk fills 3 bytes into the rewrite (the file size limit stands in for it)
        with file_size_limit(3):
            rundir.truncate_metrics(metrics, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    assert metrics.read_bytes() == b'{"step": 1}\n{"step": 2}\n'
