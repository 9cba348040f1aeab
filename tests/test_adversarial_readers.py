"""Hostile files where the toolkit reads one, through the real CLI: a named pipe or a device in place
of run.json, metrics.jsonl, a dataset chunk or a source file; metadata that is not UTF-8, nested
without end or holds a number too large for a float; names made of Unicode digits; runs behind
symbolic links or in unreadable folders; a user regex that backtracks without end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from adversarial import expect_refusal, jepa_env, run_jepa
from PIL import Image
from test_encode import RECIPE
from test_encode import trained as run_and_data  # noqa: F401 - a fixture: one tiny run at step 0 and its data

pytestmark = pytest.mark.slow

TIMEOUT = 120  # s: a reader that waits on a pipe fails the test instead of hanging it


def fake_run(path: Path, rows: list[bytes] | None = None) -> Path:
    """A run folder as `jepa train` leaves it, without checkpoints: run.json and metrics.jsonl holding
    `rows` (lines, default two rows with losses 0.5 and 0.25)."""
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"jepa_kind": "run", "config": {"objective": "ijepa"},
                                               "lengths": {"steps": 2}, "status": "finished"}))
    if rows is None:
        rows = [b'{"step": 1, "loss": 0.5}', b'{"step": 2, "loss": 0.25}']
    (path / "metrics.jsonl").write_bytes(b"".join(row + b"\n" for row in rows))
    return path


def make_fifo(path: Path) -> Path:
    """`path` replaced by a named pipe that no process writes to (reading it waits forever)."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


def copy_run(run: Path, where: Path) -> Path:
    return Path(shutil.copytree(run, where, symlinks=True))


def stdout_json(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return json.loads(result.stdout)


# -- a named pipe where a file is read: refused before it is read ------------------------------------

def _run_json_pipe(tmp_path, trained, command):
    run = fake_run(tmp_path / "run")
    make_fifo(run / "run.json")
    extra = {"export": ["-o", tmp_path / "out.safetensors"]}.get(command, [])
    return [command, run, *extra], run / "run.json"


def _metrics_pipe(tmp_path, trained, command):
    if command == "train":
        run, data = copy_run(trained[0], tmp_path / "run"), trained[1]
        args = ["train", "--config", RECIPE, "--data", data, "--out", run, "--resume", "--steps", "1",
                "--batch-size", "8", "--mesh", "data=1"]
    else:
        run = fake_run(tmp_path / "run")
        args = [command, run, *(["-o", tmp_path / "c.png"] if command == "plot" else [])]
    return args, make_fifo(run / "metrics.jsonl")


def _chunk_pipe(tmp_path, trained, command):
    run, data = trained
    copy = copy_run(data, tmp_path / "data.zarr")
    chunk = next(p for p in sorted((copy / "inputs").rglob("*")) if p.is_file() and p.name != "zarr.json")
    return ["encode-latents", run, copy, "-o", tmp_path / "emb.zarr", "--mesh", "data=1"], make_fifo(chunk)


def _npy_pipe(tmp_path, trained, command):
    return ["ingest", tmp_path / "f.npy", tmp_path / "out.zarr"], make_fifo(tmp_path / "f.npy")


def _labels_pipe(tmp_path, trained, command):
    (tmp_path / "src").mkdir()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / "src" / "0.png")
    return ["ingest", tmp_path / "src", tmp_path / "out.zarr", "--labels", tmp_path / "l.csv"], \
        make_fifo(tmp_path / "l.csv")


@pytest.mark.parametrize("make, command", [
    (_run_json_pipe, "runs"), (_run_json_pipe, "info"), (_run_json_pipe, "export"),
    (_metrics_pipe, "runs"), (_metrics_pipe, "info"), (_metrics_pipe, "plot"), (_metrics_pipe, "train"),
    (_chunk_pipe, "encode-latents"), (_npy_pipe, "ingest"), (_labels_pipe, "ingest"),
], ids=["runs-run.json", "info-run.json", "export-run.json", "runs-metrics", "info-metrics", "plot-metrics",
        "train-resume-metrics", "encode-latents-chunk", "ingest-npy", "ingest-labels-csv"])
def test_a_named_pipe_where_a_file_is_read_is_refused_in_one_line(run_and_data, tmp_path, make, command):
    args, pipe = make(tmp_path, run_and_data, command)
    expect_refusal(*args, fragments=[str(pipe), "is a named pipe (fifo), not a regular file"], timeout=TIMEOUT)


@pytest.mark.parametrize("kind", ["image", "audio", "video"])
def test_a_named_pipe_among_a_folders_media_files_is_refused_in_one_line(tmp_path, kind):
    source = tmp_path / "src"
    (source / "a").mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(source / "a" / "0.png")
    pipe = make_fifo(source / "a" / {"image": "1.png", "audio": "1.wav", "video": "1.mp4"}[kind])
    expect_refusal("ingest", source, tmp_path / "out.zarr", guard=[tmp_path / "out.zarr"], timeout=TIMEOUT,
                   fragments=[str(pipe), "is not a regular file"])


def test_a_run_json_that_is_a_kernel_pseudo_file_is_refused(tmp_path):
    run = fake_run(tmp_path / "run")
    (run / "run.json").unlink()
    (run / "run.json").symlink_to("/proc/self/status")
    expect_refusal("info", run, timeout=TIMEOUT, fragments=[str(run / "run.json"), "pseudo-file of the kernel"])


# -- metrics.jsonl and run.json whose bytes are hostile ---------------------------------------------

def _final(command: str, run: Path) -> tuple[int, float]:
    """(last step, last finite loss) as `jepa runs --json` or `jepa info --json` reports them."""
    out = stdout_json(run_jepa(command, run, "--json", timeout=TIMEOUT))
    if command == "runs":
        row = out["runs"][0]
        return row["step"], row["final_loss"]
    return out["latest_metrics"]["step"], out["loss_curve"]["last"]


@pytest.mark.parametrize("command", ["runs", "info"])
def test_metrics_lines_that_are_not_utf8_json_are_skipped(tmp_path, command):
    run = fake_run(tmp_path / "run", [b'{"step": 1, "loss": 0.5}', bytes(range(256)).replace(b"\n", b""),
                                      b'{"step": 2, "note": "caf\xe9", "loss": 9}', b'{"step": 3, "loss": 0.25}'])
    assert _final(command, run) == (3, 0.25)


@pytest.mark.parametrize("command", ["runs", "info"])
def test_a_loss_written_with_400_digits_is_no_finite_loss(tmp_path, command):
    run = fake_run(tmp_path / "run", [b'{"step": 1, "loss": 0.5}', b'{"step": 2, "loss": %s}' % (b"9" * 400)])
    assert _final(command, run) == (2, 0.5)


def test_a_metrics_line_nested_100000_deep_is_skipped(tmp_path):
    deep = b'{"step": 3, "loss": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    run = fake_run(tmp_path / "run", [b'{"step": 1, "loss": 0.5}', deep])
    assert _final("runs", run) == (1, 0.5)


def test_a_run_json_nested_100000_deep_is_refused_as_damaged(tmp_path):
    run = fake_run(tmp_path / "run")
    (run / "run.json").write_text('{"config": ' + "[" * 100_000 + "]" * 100_000 + "}")
    expect_refusal("runs", run, fragments=[f"{run / 'run.json'}: damaged", "nested deeper than 100 levels"],
                   timeout=TIMEOUT)


@pytest.mark.parametrize("command", ["runs", "info"])
def test_a_metrics_file_linked_to_dev_zero_is_refused(tmp_path, command):
    run = fake_run(tmp_path / "run")
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").symlink_to("/dev/zero")
    expect_refusal(command, run, fragments=[str(run / "metrics.jsonl"), "is a character device"], timeout=TIMEOUT)


# -- names made of Unicode digits ---------------------------------------------------------------------

@pytest.mark.parametrize("command", ["runs", "export"])
def test_a_checkpoint_folder_named_by_a_unicode_digit_is_no_step(run_and_data, tmp_path, command):
    run = copy_run(run_and_data[0], tmp_path / "run")
    (run / "checkpoints" / "\u00b2").mkdir()  # '²': str.isdigit() says yes, int() says no
    args = ["-o", tmp_path / "enc.safetensors"] if command == "export" else []
    result = run_jepa(command, run, *args, "--json", timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    if command == "runs":
        assert json.loads(result.stdout)["runs"][0]["step"] == 0


# -- runs behind symbolic links and in unreadable folders ------------------------------------------

def test_runs_lists_a_run_behind_a_symlinked_folder_once_despite_a_link_cycle(tmp_path):
    fake_run(tmp_path / "elsewhere" / "run")
    top = tmp_path / "top"
    top.mkdir()
    (top / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (top / "loop").symlink_to(top, target_is_directory=True)
    out = stdout_json(run_jepa("runs", top, "--json", timeout=TIMEOUT))
    assert [row["run"] for row in out["runs"]] == [str(top / "linked" / "run")]


def test_runs_warns_about_a_folder_it_cannot_read(tmp_path):
    fake_run(tmp_path / "top" / "a")
    locked = tmp_path / "top" / "locked"
    fake_run(locked / "b")
    # root reads any folder; without the capabilities that let it, a mode of 000 stops it too
    drop = (["setpriv", "--inh-caps=-dac_override,-dac_read_search",
             "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else [])
    if drop and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: every folder is readable")
    locked.chmod(0)
    try:
        result = subprocess.run([*drop, sys.executable, "-m", "jepa_cli", "runs", tmp_path / "top", "--json"],
                                env=jepa_env(), capture_output=True, timeout=TIMEOUT)
    finally:
        locked.chmod(0o755)
    assert [row["run"] for row in stdout_json(result)["runs"]] == [str(tmp_path / "top" / "a")]
    assert result.stderr.decode().splitlines() == [
        f"jepa: warning: {locked}: cannot read this folder (permission denied); the runs in it are not listed"]


# -- a user regex that backtracks without end ----------------------------------------------------------

@pytest.mark.parametrize("option", ["--label-regex", "--group-regex"])
def test_a_user_regex_that_backtracks_without_end_is_refused_naming_option_and_name(tmp_path, option):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a" * 40 + "b", "c"):
        Image.fromarray(np.zeros((4, 4), np.uint8)).save(src / f"{name}.png")
    pattern = "^(a|aa)+$"  # 2^40 ways to fail on forty a's before a b
    line = expect_refusal("ingest", src, tmp_path / "tr.zarr", option, pattern, guard=[tmp_path],
                          fragments=[f"{option} {pattern!r} takes more than 1 s on the name", "a" * 40 + "b"],
                          timeout=TIMEOUT)
    assert "Error" not in line
