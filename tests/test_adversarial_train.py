"""Hostile-user cases for `jepa train`, run directories and checkpoints, through the real CLI
in a subprocess (tests/adversarial.py): one error line, the right exit code, nothing changed on disk.

Most cases train the toy objective (tests/toy_objective.py, loaded as `toy_objective:make`) on 8x8
images: a subprocess then costs a few seconds. The mask cases need I-JEPA, with a one-block ViT."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from adversarial import assert_one_error_line, damage_checkpoint, expect_refusal, jepa_env, run_jepa, snapshot
from conftest import assert_user_error

from jepa_cli.data import store
from jepa_cli.training.config import build_config
from jepa_cli.training.loop import train

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent
TOY_ENV = {"PYTHONPATH": str(TESTS)}  # toy_objective importable in the subprocess
TOY = ["--objective", "toy_objective:make", "--mesh", "data=1", "--batch-size", "16"]
IJEPA_TOML = """
objective = "ijepa"
batch_size = 8
mesh = "data=1"
warmup_steps = 1
[ijepa]
model = "tiny"
depth = 1
width = 16
heads = 2
patch_size = 4
pred_depth = 1
pred_width = 16
min_keep = 4
"""


def _write_images(path: Path, n: int, size: int) -> Path:
    rng = np.random.default_rng(0)
    store.write_group(path, store.base_attributes("dataset", modality="image", layout="NHWC", class_names=[]))
    store.write_array(path / "inputs", rng.integers(0, 256, (n, size, size, 1), dtype=np.uint8))
    return path


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory) -> Path:
    return _write_images(tmp_path_factory.mktemp("toy") / "toy.zarr", 64, 8)


@pytest.fixture
def finished_run(toy_data, tmp_path) -> Path:
    """A toy run of 4 steps with checkpoints at steps 2 and 4 (trained in this process)."""
    run = tmp_path / "run"
    train(build_config(dict(objective="toy_objective:make", data=str(toy_data), out=str(run), steps=4,
                            batch_size=16, mesh="data=1", save_every=2, warmup_steps=1)))
    return run


def _start_toy_training(data: Path, run: Path) -> subprocess.Popen:
    """`jepa train` of the toy objective that runs until signalled; returns once it logged a row."""
    proc = subprocess.Popen([sys.executable, "-m", "jepa_cli", "train", *TOY, "--data", str(data), "--out", str(run),
                             "--steps", "1000000", "--save-every", "200", "--json", "-q"],
                            env=jepa_env(TOY_ENV), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.stat().st_size > 0):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "training logged no row in 120 s"
        time.sleep(0.2)
    return proc


# ---- validation before writing (issue item 6) --------------------------------------------------------

@pytest.mark.parametrize("option", [["--pred-scale", "0.9,0.1"], ["--min-keep", "400"]],
                         ids=["inverted-pred-scale", "min-keep-above-grid"])
def test_bad_mask_option_creates_nothing(tmp_path, option):
    data = _write_images(tmp_path / "digits.zarr", 16, 16)
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(IJEPA_TOML)
    expect_refusal("train", "--config", recipe, "--data", data, "--out", tmp_path / "run", "--steps", "1", *option,
                   guard=[tmp_path], fragments=[option[0]])


def test_corrected_retry_after_a_refused_option_trains(tmp_path, run_cli):
    data = _write_images(tmp_path / "digits.zarr", 16, 16)
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(IJEPA_TOML)
    run = tmp_path / "run"
    expect_refusal("train", "--config", recipe, "--data", data, "--out", run, "--steps", "1", "--pred-scale", "0.9,0.1",
                   guard=[tmp_path])
    # --steps 0 (the initial weights) is the cheapest run that validates, writes RUN and a checkpoint
    result = run_cli("train", "--config", recipe, "--data", data, "--out", run, "--steps", "0", "--json", "-q")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["checkpoints"] == [0]
    assert json.loads((run / "run.json").read_text())["status"] == "finished"


# ---- one trainer per run (issue item 5) ---------------------------------------------------------------

def test_second_trainer_on_a_run_in_use_is_refused_naming_the_holder(toy_data, tmp_path):
    run = tmp_path / "run"
    first = _start_toy_training(toy_data, run)
    try:
        first.send_signal(signal.SIGSTOP)  # frozen, so the guarded run cannot change under the check
        expect_refusal("train", *TOY, "--data", toy_data, "--out", run, "--steps", "5000", "--resume",
                       guard=[run], fragments=[str(run), f"pid {first.pid}"], env=TOY_ENV)
    finally:
        first.send_signal(signal.SIGCONT)
        first.kill()
        first.communicate()


# ---- signals -------------------------------------------------------------------------------------------

def test_sigterm_saves_the_step_and_exits_143_with_one_line(toy_data, tmp_path):
    run = tmp_path / "run"
    proc = _start_toy_training(toy_data, run)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    line = assert_one_error_line(subprocess.CompletedProcess([], proc.returncode, stdout, stderr), code=143,
                                 fragments=["terminated (SIGTERM)", "--resume"])
    result = json.loads(stdout)
    assert result["interrupted"] == "SIGTERM" and f"saved step {result['step']} " in line
    assert result["step"] in result["checkpoints"]
    assert json.loads((run / "run.json").read_text())["status"] == "interrupted"


# ---- recipes (issue: a TOML value of the wrong type, a seed out of range) ----------------------------

def test_toml_value_of_the_wrong_type_names_the_key_and_file(toy_data, tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('steps = "two"\n')
    expect_refusal("train", "--config", recipe, *TOY, "--data", toy_data, "--out", tmp_path / "run",
                   guard=[tmp_path], fragments=[str(recipe), "steps", "'two'"], env=TOY_ENV)


def test_toml_objective_option_of_the_wrong_type_names_the_option(toy_data, tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('steps = 1\n[ijepa]\ndepth = "two"\n')
    expect_refusal("train", "--config", recipe, "--data", toy_data, "--out", tmp_path / "run",
                   guard=[tmp_path], fragments=["ijepa option depth must be an integer, got 'two'"])


def test_toml_syntax_error_names_the_file_and_line(toy_data, tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text("steps = 3\nbatch_size = = 4\n")
    expect_refusal("train", "--config", recipe, *TOY, "--data", toy_data, "--out", tmp_path / "run",
                   guard=[tmp_path], fragments=[str(recipe), "line 2"], env=TOY_ENV)


# ---- --data and --out ------------------------------------------------------------------------------------

def test_data_that_is_a_masks_file_is_refused(tmp_path):
    masks = tmp_path / "masks.zarr"
    store.write_group(masks, store.base_attributes("masks", strategy="multiblock"))
    expect_refusal("train", *TOY, "--data", masks, "--out", tmp_path / "run", "--steps", "1",
                   guard=[tmp_path], fragments=[str(masks), "'masks'", "not a dataset"], env=TOY_ENV)


def test_out_inside_the_dataset_is_refused(toy_data, tmp_path):
    expect_refusal("train", *TOY, "--data", toy_data, "--out", toy_data / "run", "--steps", "1",
                   guard=[toy_data], fragments=[str(toy_data / "run"), f"lies inside the input {toy_data}"],
                   env=TOY_ENV)


def _refused_in_process(run_cli, args: list, guard: list, *fragments: str) -> None:
    """`jepa ARGS` run in this process exits 2 with one error line naming `fragments`; `guard` unchanged."""
    before = snapshot(guard)
    assert_user_error(run_cli(*map(str, args)), *fragments)
    assert snapshot(guard) == before


def test_tensorboard_inside_the_dataset_is_refused(run_cli, toy_data, tmp_path):
    board = toy_data / "tb"
    _refused_in_process(run_cli, ["train", *TOY, "--data", toy_data, "--out", tmp_path / "run", "--steps", "1",
                                  "--tensorboard", board], [toy_data, tmp_path],
                        str(board), f"lies inside the input {toy_data}")


def test_out_inside_a_probe_data_set_is_refused(run_cli, toy_data, tmp_path):
    probe = _write_images(tmp_path / "probe.zarr", 16, 8)
    run = probe / "run"
    _refused_in_process(run_cli, ["train", *TOY, "--data", toy_data, "--out", run, "--steps", "1",
                                  "--probe-every", "1", "--probe-data", f"{probe},{probe}"], [tmp_path],
                        str(run), f"lies inside the input {probe}")


def test_tensorboard_naming_a_file_is_refused_before_run_is_created(run_cli, toy_data, tmp_path):
    board = tmp_path / "events"
    board.write_text("mine")
    _refused_in_process(run_cli, ["train", *TOY, "--data", toy_data, "--out", tmp_path / "run", "--steps", "1",
                                  "--tensorboard", board], [tmp_path],
                        str(board), "names a file, not a folder")


def test_resume_of_a_missing_run_without_data_says_the_run_does_not_exist(run_cli, tmp_path):
    run = tmp_path / "missing"
    _refused_in_process(run_cli, ["train", *TOY, "--resume", "--out", run, "--steps", "1"], [tmp_path],
                        f"{run}: does not exist")


# ---- damaged checkpoints ---------------------------------------------------------------------------------

def test_info_describes_a_run_whose_newest_checkpoint_is_damaged(finished_run):
    damage_checkpoint(finished_run, 4)
    before = snapshot([finished_run])
    result = run_jepa("info", finished_run, "--json", env=TOY_ENV)
    assert result.returncode == 0, result.stderr.decode()
    info = json.loads(result.stdout)
    assert info["checkpoints"] == [2, 4] and info["unreadable_checkpoints"] == [4]
    assert info["params_sha256_step"] == 2 and len(info["params_sha256"]) == 64
    assert snapshot([finished_run]) == before


def test_ema_inspect_of_a_damaged_step_names_the_step(finished_run):
    damage_checkpoint(finished_run, 4)
    expect_refusal("ema-inspect", finished_run, "--step", "4", guard=[finished_run],
                   fragments=["checkpoint at step 4 is unreadable", str(finished_run / "checkpoints" / "4")],
                   env=TOY_ENV)


@pytest.mark.parametrize("record", ['{"jepa_kind": "run"}', "[1, 2]", "not json"], ids=["no-config", "a-list", "garbage"])
@pytest.mark.parametrize("command", ["info", "ema-inspect", "train"])
def test_a_damaged_run_json_is_one_line_naming_it(tmp_path, toy_data, command, record):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(record)
    args = {"info": ["info", run], "ema-inspect": ["ema-inspect", run],
            "train": ["train", "--resume", "--out", run, "--data", toy_data]}[command]
    expect_refusal(*args, guard=[tmp_path], fragments=[f"{run / 'run.json'}: damaged"])


# ---- a resumed run keeps its dataset --------------------------------------------------------------------

def _toy_run(data: Path, run: Path) -> Path:
    """A toy run of 2 steps on `data` (trained in this process)."""
    train(build_config(dict(objective="toy_objective:make", data=str(data), out=str(run), steps=2, batch_size=16,
                            mesh="data=1", warmup_steps=1)))
    return run


def test_resume_on_another_dataset_is_refused_naming_both(run_cli, toy_data, tmp_path):
    run = _toy_run(toy_data, tmp_path / "run")
    other = _write_images(tmp_path / "other.zarr", 64, 8)  # the same images, another dataset
    _refused_in_process(run_cli, ["train", *TOY, "--resume", "--out", run, "--data", other, "--steps", "4"],
                        [tmp_path], f"{run}: was started on the dataset {toy_data}, not {other}",
                        "--allow-new-data")


def test_resume_on_the_same_dataset_moved_elsewhere_continues(run_cli, tmp_path):
    data = _write_images(tmp_path / "toy.zarr", 64, 8)
    run = _toy_run(data, tmp_path / "run")
    moved = data.rename(tmp_path / "moved.zarr")
    result = run_cli("train", *TOY, "--resume", "--out", str(run), "--data", str(moved), "--steps", "3", "--json", "-q")
    assert result.exit_code == 0, result.stderr
    assert json.loads((run / "run.json").read_text())["dataset"]["path"] == str(moved.resolve())


def test_allow_new_data_continues_a_run_on_another_dataset(run_cli, toy_data, tmp_path):
    run = _toy_run(toy_data, tmp_path / "run")
    other = _write_images(tmp_path / "other.zarr", 64, 8)
    result = run_cli("train", *TOY, "--resume", "--out", str(run), "--data", str(other), "--steps", "3",
                     "--allow-new-data", "--json", "-q")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["checkpoints"] == [2, 3]
    assert json.loads((run / "run.json").read_text())["dataset"]["path"] == str(other.resolve())


@pytest.mark.parametrize("kind", ["missing", "a run"])
def test_a_bad_dataset_is_refused_before_jax_loads(tmp_path, kind):
    # the refusal takes a fraction of a second instead of JAX's import (2 s)
    if kind == "missing":
        data, reason = tmp_path / "missing.zarr", "no such dataset"
    else:
        data, reason = tmp_path / "run.zarr", "is a 'run', not a dataset"
        data.mkdir()
        (data / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": {"jepa_kind": "run"}}')
    code = ("import sys\nfrom jepa_cli.cli.main import cli\n"
            "try:\n    cli.main(sys.argv[1:], prog_name='jepa')\n"
            "finally:\n    print('jax loaded' if 'jax' in sys.modules else 'no jax')\n")
    done = subprocess.run([sys.executable, "-c", code, "train", "--config", "builtin:ijepa-digits-tiny", "--data",
                           str(data), "--out", str(tmp_path / "out")], env=jepa_env(), capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stdout.strip()) == (2, "no jax")
    assert done.stderr.strip().splitlines() == [f"jepa: error: {data}: {reason}"]
    assert not (tmp_path / "out").exists()
