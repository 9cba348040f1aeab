"""recipes/quickstart.mk driven by make through a real shell: every artifact, then only what is stale."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The make runs see one CPU device, not the suite's 8 simulated ones: this file tests make's
# orchestration, and a warm compilation cache deadlocked their 8-device all-reduces (cli/main.py,
# compilation_cache_dir); one device keeps the suite's cache and compiles less.
ONE_DEVICE = {**os.environ, "XLA_FLAGS": ""}
TINY_RECIPE = """
objective = "ijepa"
batch_size = 32
lr = 2e-3
warmup_steps = 1
[ijepa]
model = "tiny"
depth = 2
width = 32
heads = 2
patch_size = 4
pred_depth = 1
pred_width = 16
min_keep = 4
"""


def _make(out: Path, recipe: Path, *extra: str, cwd: Path) -> subprocess.CompletedProcess:
    jepa = f"{shlex.quote(sys.executable)} -m jepa_cli"
    return subprocess.run(["make", "--no-print-directory", "-f", str(ROOT / "recipes" / "quickstart.mk"),
                           f"OUT={out}", f"RECIPE={recipe}", f"JEPA={jepa}", f"PYTHON={sys.executable}", "STEPS=3",
                           "PROBE_TYPES=knn", "-j2",
                           *extra], cwd=cwd, capture_output=True, text=True, env=ONE_DEVICE, timeout=600)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("quickstart")
    recipe = root / "tiny.toml"
    recipe.write_text(TINY_RECIPE)
    done = _make(Path("out"), recipe, cwd=root)
    assert done.returncode == 0, done.stderr
    return root, recipe, done


def test_every_artifact_is_built_and_the_table_printed(built):
    root, _, done = built
    out = root / "out"
    for split in ("train", "test"):
        assert (out / f"data-{split}.zarr" / "zarr.json").exists()
    assert json.loads((out / "run-init.json").read_text())["step"] == 0
    assert json.loads((out / "run-pretrained.json").read_text())["step"] == 3
    probe = json.loads((out / "probe-knn-pretrained.json").read_text())
    assert probe["encoder"]["run"] == str((out / "run-pretrained").resolve()) and probe["encoder"]["step"] == 3
    assert probe["encoder"]["weights"] == "target"
    assert json.loads((out / "probe-knn-raw.json").read_text())["encoder"] is None
    assert not list(out.glob("probe-linear-*"))  # PROBE_TYPES=knn
    lines = (out / "table.txt").read_text().splitlines()
    assert lines[0] == "builtin:digits test split, top-1 accuracy (1438 train / 359 test)"
    assert [line.split("  ")[0] for line in lines[2:]] == [
        "raw inputs (--raw)", "run-init target encoder, step 0 (random init)", "run-pretrained target encoder, step 3"]
    assert done.stdout.endswith((out / "table.txt").read_text())
    assert not list(out.glob("*.tmp"))


def test_nothing_reruns_when_nothing_changed(built):
    root, recipe, _ = built
    assert _make(Path("out"), recipe, "-q", "out/table.txt", cwd=root).returncode == 0  # -q: 0 means up to date


def test_touching_the_recipe_reruns_the_runs_and_what_follows_not_the_data(built):
    root, recipe, _ = built
    import time

    stamp = time.time() + 60  # newer than every artifact, however long the build took
    os.utime(recipe, (stamp, stamp))
    plan = _make(Path("out"), recipe, "-n", "out/table.txt", cwd=root).stdout  # -n: print, run nothing
    commands = [line for line in plan.splitlines() if "jepa_cli" in line or "probe_table" in line]
    assert sum(" train " in c for c in commands) == 2
    assert sum(" encode-latents " in c for c in commands) == 4
    assert sum(" probe " in c for c in commands) == 2 and not any("--raw" in c for c in commands)
    assert sum("probe_table.py" in c for c in commands) == 1
    assert not any(" ingest " in c for c in commands) and len(commands) == 9


def test_a_failed_step_leaves_no_target(tmp_path):
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(TINY_RECIPE)
    done = _make(Path("out"), recipe, "TRAIN_FLAGS=--lr -1", cwd=tmp_path)
    assert done.returncode != 0
    assert "jepa: error: --lr must be a number > 0, got -1.0" in done.stderr
    assert not list((tmp_path / "out").glob("run-*.json"))


def _plan(name: str, *variables: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-n", "-f", str(ROOT / "recipes" / name), *variables],
                          cwd=cwd, capture_output=True, text=True, timeout=60)


def test_the_in1k_recipe_ingests_train_and_val_as_two_sources_and_trains_the_official_recipe(tmp_path):
    plan = _plan("ijepa-in1k.mk", "IN1K=/data/imagenet", "MESH=data=-1,fsdp=8", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    lines = plan.stdout.splitlines()
    ingests = [line for line in lines if line.startswith("jepa ingest")]
    assert ingests == [
        "jepa ingest /data/imagenet/train in1k/data-train.zarr --size 256x256  --channels 3 --skip-bad --force -q",
        "jepa ingest /data/imagenet/val in1k/data-test.zarr --size 256x256  --channels 3 --skip-bad --force -q"]
    trains = [line for line in lines if line.startswith("jepa train")]
    assert len(trains) == 2 and all("ijepa-in1k-vith14.toml" in t and "--mesh data=-1,fsdp=8" in t for t in trains)


def test_the_folder_recipe_splits_one_folder_and_needs_its_source(tmp_path):
    plan = _plan("ijepa-folder.mk", "SOURCE=photos", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "jepa ingest photos folder-run/data-test.zarr --size 32x32 --split test --seed 0 --channels 3 --skip-bad" \
        " --force -q" in plan.stdout
    missing = _plan("ijepa-folder.mk", cwd=tmp_path)
    assert missing.returncode != 0 and "set SOURCE=path/to/images" in missing.stderr


def test_the_audio_and_video_recipes_are_the_quickstart_with_their_source_shape_and_recipe(tmp_path):
    audio = _plan("audio-jepa-tones.mk", cwd=tmp_path).stdout
    assert "jepa ingest builtin:tones tones/data-train.zarr --sample-rate 16000 --seconds 1 --split train" in audio
    assert "audio-jepa-tones-tiny.toml" in audio and "--size" not in audio
    video = _plan("vjepa-moving-digits.mk", cwd=tmp_path).stdout
    assert "jepa ingest builtin:moving-digits moving-digits/data-test.zarr  --split test --seed 0" in video
    assert "vjepa-moving-digits-tiny.toml" in video


def test_the_flow_recipe_samples_unguided_guided_and_in_the_interval_then_measures_fd(tmp_path):
    plan = _plan("flow-digits.mk", "SCALE=3", cwd=tmp_path).stdout.splitlines()
    samples = [line for line in plan if line.startswith("jepa sample")]
    assert [s.split(" -o ")[0].split("--classes all ")[1] for s in samples] == [
        "--guidance-scale 1 --seed 0", "--guidance-scale 3 --seed 0",
        "--guidance-scale 3 --guidance-interval 0.22,0.84 --seed 0"]
    fds = [line for line in plan if line.startswith("jepa fd")]
    assert len(fds) == 3 and all("--run flow-digits/encoder" in line for line in fds)
