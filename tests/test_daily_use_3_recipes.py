"""The recipes on real data: one SIZE shapes the dataset and the model, `jepa train` says when they
differ, slow commands speak from the first minute, a signal leaves no temporary file, a changed
TRAIN_FLAGS leaves the baseline alone, and a clean chain writes nothing but progress on stderr."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from rich.console import Console

from conftest import COMPILE_FASTER
from test_recipes_make import ROOT, Fake, fake  # noqa: F401 - a fixture: the quickstart made once

from jepa_cli.cli import common
from jepa_cli.cli.train import TrainProgress
from jepa_cli.training.plan import geometry_warning

ONE_DEVICE = {**os.environ, "XLA_FLAGS": COMPILE_FASTER}


def _value(call: list[str], flag: str) -> str | None:
    return call[call.index(flag) + 1] if flag in call else None


# ---- one SIZE reaches ingest and train ------------------------------------------------------------


@pytest.mark.slow
def test_the_video_recipes_size_reaches_ingest_and_both_runs(tmp_path):
    fake = Fake(tmp_path, "vjepa-moving-digits.mk")
    assert fake.make("OUT=out", "SIZE=64x64").returncode == 0
    assert [_value(c, "--size") for c in fake.calls if c[0] == "ingest"] == ["64x64", "64x64"]
    assert [_value(c, "--image-size") for c in fake.calls if c[0] == "train"] == ["64x64", "64x64"]


@pytest.mark.slow
def test_a_size_given_in_shape_flags_reaches_both_runs(tmp_path):
    fake = Fake(tmp_path, "vjepa-moving-digits.mk")
    assert fake.make("OUT=out", "SHAPE_FLAGS=--frames 8 --size 48x40").returncode == 0
    assert [_value(c, "--frames") for c in fake.calls if c[0] == "ingest"] == ["8", "8"]
    assert [_value(c, "--image-size") for c in fake.calls if c[0] == "train"] == ["48x40", "48x40"]


# ---- jepa train: the dataset's geometry against the model's ---------------------------------------

IMAGES_64 = {"modality": "image", "height": 64, "width": 64, "channels": 3, "shape": [64, 64, 3], "attrs": {}}


def test_images_larger_than_the_model_takes_are_named_with_the_option_to_set():
    message = geometry_warning("ijepa", {"image_size": 32, "eval_resize_ratio": 1.0}, IMAGES_64)
    assert message == ("the dataset holds 64x64 images, the model takes 32x32 (image_size): every sample is resized "
                       "to 32x32; pass --image-size 64x64 to train at the dataset's size, or ingest with --size 32x32")


def test_images_of_the_models_size_give_no_warning():
    assert geometry_warning("ijepa", {"image_size": [64, 64], "eval_resize_ratio": 1.0}, IMAGES_64) is None


def test_images_stored_at_the_evaluation_resize_of_the_crop_give_no_warning():
    stored = {**IMAGES_64, "height": 256, "width": 256, "shape": [256, 256, 3]}  # the official Resize(256) of 224
    assert geometry_warning("ijepa", {"image_size": 224, "eval_resize_ratio": 256 / 224}, stored) is None


def test_clips_of_another_frame_size_are_named():
    clips = {"modality": "video", "shape": [16, 64, 64, 1], "attrs": {}}
    message = geometry_warning("vjepa", {"image_size": 32, "num_frames": 16}, clips)
    assert message.startswith("the dataset holds 64x64 frames, the model takes 32x32 (image_size)")


def test_audio_clips_of_another_length_are_named_and_the_same_length_is_not():
    audio = {"modality": "audio", "shape": [32000], "attrs": {"sample_rate": 16000}}
    message = geometry_warning("audio-jepa", {"seconds": 1.0, "sample_rate": 16000}, audio)
    assert message.startswith("the dataset holds 2 s clips at 16000 Hz, the model takes 1 s at 16000 Hz "
                              "(seconds, sample_rate): every clip is cropped or padded to 16000 samples")
    assert geometry_warning("audio-jepa", {"seconds": 2.0, "sample_rate": 16000}, audio) is None


def _jepa(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jepa_cli", *args], cwd=cwd, capture_output=True, text=True,
                          env=ONE_DEVICE, timeout=600)


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """builtin:digits at 16x16, 128 of them."""
    root = tmp_path_factory.mktemp("digits")
    done = _jepa("ingest", "builtin:digits", "d.zarr", "--size", "16x16", "--limit", "128", "-q", cwd=root)
    assert done.returncode == 0, done.stderr
    return root


TINY = ["--config", "builtin:ijepa-digits-tiny", "--data", "d.zarr", "--batch-size", "32", "--warmup-steps", "1",
        "--ema", "0.5,1"]


@pytest.mark.slow
def test_jepa_train_warns_when_the_recipes_image_size_is_not_the_datasets(digits):
    done = _jepa("train", *TINY, "--image-size", "32", "--steps", "0", "--out", "r32", "--force", cwd=digits)
    assert done.returncode == 0, done.stderr
    assert ("jepa: warning: the dataset holds 16x16 images, the model takes 32x32 (image_size): every sample is "
            "resized to 32x32; pass --image-size 16x16") in done.stderr


# ---- progress from the first minute ---------------------------------------------------------------


def test_plain_training_lines_come_within_30_s_of_the_first_update_then_at_least_every_60_s(monkeypatch):
    now = [0.0]
    monkeypatch.setattr("jepa_cli.cli.train.time.perf_counter", lambda: now[0])
    written = io.StringIO()
    monkeypatch.setattr(common, "stderr_console", lambda quiet=False: Console(file=written, width=200, quiet=quiet))
    with common.live_progress(*TrainProgress.columns()) as progress:
        shown = TrainProgress(progress, log_every=50, batch_size=8)
        shown.on_start({"run": "r", "start_step": 0, "steps": 300, "mesh": {}, "devices": 1, "processes": 1})
        for step in range(1, 61):
            now[0] = 600.0 + 8.0 * (step - 1)  # compiled for 10 minutes, then 8 s an update
            shown.on_step({"step": step, "loss": 0.5})
    steps = [int(line.split()[1].split("/")[0]) for line in written.getvalue().splitlines()[1:]]
    # the last report before 30 s (step 4 at 24 s; step 5 comes at 32 s), then the last before each
    # 60 s after a line (80 s, 136 s, ...), and step 50 (log_every)
    assert steps == [4, 11, 18, 25, 32, 39, 46, 50, 57]


@pytest.mark.slow
def test_the_linear_probe_warns_of_its_cost_up_front_above_the_feature_threshold(digits, monkeypatch):
    from jepa_cli.cli import probe

    monkeypatch.chdir(digits)
    monkeypatch.setattr(probe, "LINEAR_SLOW_FEATURES", 255)  # the digits have 256 features
    done = CliRunner().invoke(probe.command, ["linear", "d.zarr", "d.zarr", "--raw", "--json"])
    assert done.exit_code == 0, done.output
    assert ("jepa: warning: --raw: 256 features a sample: the linear probe's fits on 128 samples will take "
            "minutes; pool or downsample") in done.stderr


@pytest.mark.slow
def test_the_linear_probe_says_nothing_of_its_cost_at_the_threshold(digits, monkeypatch):
    from jepa_cli.cli import probe

    monkeypatch.chdir(digits)
    monkeypatch.setattr(probe, "LINEAR_SLOW_FEATURES", 256)
    done = CliRunner().invoke(probe.command, ["linear", "d.zarr", "d.zarr", "--raw", "--json"])
    assert done.exit_code == 0, done.output
    assert done.stderr == ""


# ---- the baseline and signals ---------------------------------------------------------------------


@pytest.mark.slow
def test_a_changed_train_flags_reruns_the_pretrained_run_and_what_follows_not_the_baseline(fake):
    assert fake.make("OUT=out", "TRAIN_FLAGS=--warmup-steps 5").returncode == 0
    assert fake.commands() == [
        "train run-pretrained", "encode-latents emb-pretrained-train.zarr", "encode-latents emb-pretrained-test.zarr",
        "probe linear emb-pretrained-train.zarr", "probe knn emb-pretrained-train.zarr", "probe_table.py"]
    assert _value(fake.calls[0], "--warmup-steps") == "5"


@pytest.mark.slow
def test_the_baseline_takes_the_batch_size_of_train_flags_so_that_it_fits_a_small_dataset(fake):
    assert fake.make("OUT=out", "TRAIN_FLAGS=--batch-size 8 --lr 1e-3").returncode == 0
    init, pretrained = [c for c in fake.calls if c[0] == "train"]
    assert Path(_value(init, "--out")).name == "run-init" and _value(init, "--batch-size") == "8"
    assert "--lr" not in init and _value(pretrained, "--lr") == "1e-3"


@pytest.mark.slow
def test_model_flags_reach_both_runs_and_rerun_the_baseline(fake):
    assert fake.make("OUT=out", "MODEL_FLAGS=--model small").returncode == 0
    trains = [c for c in fake.calls if c[0] == "train"]
    assert [Path(_value(c, "--out")).name for c in trains] == ["run-init", "run-pretrained"]
    assert all(_value(c, "--model") == "small" for c in trains)


@pytest.mark.slow
def test_an_encoder_option_in_train_flags_is_refused_before_anything_runs(fake):
    done = fake.make("OUT=out", "TRAIN_FLAGS=--lr 1e-3 --patch-size 4")
    assert done.returncode == 2 and fake.calls == []
    assert "TRAIN_FLAGS has --patch-size, which shapes the encoder: pass it in MODEL_FLAGS" in done.stderr


# The stand-in jepa, but a `train` prints the start of its result and waits (as a run does until it ends).
SLOW_TRAIN = """#!/bin/sh
echo $$ >> "$FAKE_LOG.pids"
if [ "$1" = ingest ]; then mkdir -p "$3" && echo {} > "$3/zarr.json"; fi
if [ "$1" = train ]; then echo '{"run":'; exec sleep 60; fi
echo {}
"""


@pytest.mark.slow
def test_sigterm_to_make_during_a_step_leaves_no_tmp_and_no_target_and_stops_the_step(tmp_path):
    fake = Fake(tmp_path)
    fake.jepa.write_text(SLOW_TRAIN)
    fake.log.write_text("")
    env = {**os.environ, "FAKE_LOG": str(fake.log)}
    make = subprocess.Popen(["make", "--no-print-directory", "-f", str(ROOT / "recipes" / "quickstart.mk"), "OUT=out",
                             f"JEPA={fake.jepa}", f"PYTHON={fake.jepa}"], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmp = tmp_path / "out" / "run-init.json.tmp"
    deadline = time.monotonic() + 30
    while not (tmp.exists() and tmp.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tmp.exists()
    make.send_signal(signal.SIGTERM)
    assert make.wait(timeout=30) != 0
    assert not list((tmp_path / "out").glob("*.tmp")) and not (tmp_path / "out" / "run-init.json").exists()
    train_pid = int(Path(f"{fake.log}.pids").read_text().split()[-1])
    with pytest.raises(ProcessLookupError):
        os.kill(train_pid, 0)  # the step was stopped, not left running


# ---- a clean run writes nothing but progress -------------------------------------------------------

PROGRESS = re.compile(r"run \S+: steps \d+ -> \d+, mesh .*|step \d+/\d+ .*")


@pytest.mark.slow
def test_a_clean_chain_and_the_api_write_nothing_but_progress_on_stderr(digits):
    chain = [
        ("train", *TINY, "--steps", "4", "--out", "r", "--force", "--json"),
        ("encode-latents", "r", "d.zarr", "-o", "e.zarr", "--force", "--json"),
        ("probe", "linear", "e.zarr", "e.zarr", "--json"),
        ("probe", "knn", "e.zarr", "e.zarr", "--json"),
        ("probe", "linear", "d.zarr", "d.zarr", "--raw", "--json"),
    ]
    for args in chain:
        done = _jepa(*args, cwd=digits)
        assert done.returncode == 0, done.stderr
        assert [line for line in done.stderr.splitlines() if not PROGRESS.fullmatch(line)] == [], args
    api = subprocess.run([sys.executable, "-W", "default", "-c",
                          "import numpy as np\nfrom jepa_cli import api\nrun = api.load_run('r')\n"
                          "print(run.encode(np.zeros((2, 16, 16, 1), np.uint8)).shape)"],
                         cwd=digits, capture_output=True, text=True, env=ONE_DEVICE, timeout=600)
    assert api.returncode == 0 and api.stdout == "(2, 64)\n" and api.stderr == ""


def test_raw_pool_averages_each_block_of_pixels_of_a_clip():
    from jepa_cli.evaluation.features import pool_pixels

    clip = np.arange(2 * 4 * 4, dtype=np.float32).reshape(1, 2, 4, 4, 1)  # one clip of 2 frames of 4x4
    pooled = pool_pixels(clip, 2, "c.zarr")
    # frame 0's top-left block holds 0, 1, 4, 5; frame 1's bottom-right 26, 27, 30, 31
    assert pooled.shape == (1, 2, 2, 2, 1)
    assert pooled[0, 0, 0, 0, 0] == (0 + 1 + 4 + 5) / 4 and pooled[0, 1, 1, 1, 0] == (26 + 27 + 30 + 31) / 4


@pytest.mark.slow
def test_the_raw_probe_of_pooled_pixels_reads_a_sixteenth_of_the_features(digits, run_cli):
    import json

    data = digits / "d.zarr"
    done = run_cli("probe", "knn", data, data, "--raw", "--raw-pool", "4", "--json")
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout)["dim"] == 256 // 16
    refused = run_cli("probe", "knn", data, data, "--raw-pool", "3", "--raw")
    assert refused.exit_code == 2 and "--raw-pool 3 needs images or clips whose height and width it divides" in \
        refused.stderr
