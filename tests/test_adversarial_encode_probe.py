"""Hostile-user cases for `jepa encode-latents` and `jepa probe`, through the real CLI."""

import json
import signal
import subprocess
import sys

import numpy as np
import pytest
from adversarial import damage_checkpoint, expect_refusal, start_held
from test_encode import image_dataset
from test_encode import trained as run_and_data  # noqa: F401 - a fixture: one tiny run at step 0

from jepa_cli.data import store

pytestmark = pytest.mark.slow


def test_encoding_images_with_other_channels_than_the_run_is_refused(run_and_data, tmp_path):
    run, _ = run_and_data
    rgb = image_dataset(tmp_path / "rgb.zarr", channels=3)
    expect_refusal("encode-latents", run, rgb, "-o", tmp_path / "emb.zarr", "--mesh", "data=1",
                   guard=[tmp_path, run], fragments=["rgb.zarr: images have 3 channel(s)", "--channels 1"])


def test_encoding_with_a_damaged_checkpoint_names_its_step(run_and_data, tmp_path):
    import shutil

    run, data = run_and_data
    damaged = tmp_path / "run"
    shutil.copytree(run, damaged)
    damage_checkpoint(damaged, 0)
    expect_refusal("encode-latents", damaged, data, "-o", tmp_path / "emb.zarr", "--mesh", "data=1",
                   guard=[tmp_path, data], fragments=["step 0"])


def test_encoding_a_mask_file_is_refused(run_and_data, tmp_path):
    run, _ = run_and_data
    masks = tmp_path / "m.zarr"
    store.write_group(masks, store.base_attributes("masks", format_version=1))
    expect_refusal("encode-latents", run, masks, "-o", tmp_path / "emb.zarr", guard=[tmp_path, run],
                   fragments=["m.zarr"])


def test_encoding_into_the_run_directory_is_refused(run_and_data, tmp_path):
    run, data = run_and_data
    expect_refusal("encode-latents", run, data, "-o", run, "--force", guard=[run, data], fragments=[str(run)])


def test_a_corrupt_encode_partial_progress_file_never_shows_a_traceback(run_and_data, tmp_path, run_cli):
    run, data = run_and_data
    out = tmp_path / "emb.zarr"
    partial = tmp_path / ".emb.zarr.partial"
    (partial / "progress").mkdir(parents=True)
    (partial / "job.json").write_bytes(b"\x00garbage")
    result = run_cli("encode-latents", run, data, "-o", out, "--mesh", "data=1")
    assert result.exit_code == 0, result.stderr
    assert f"jepa: warning: discarding the partial output {partial}: its job.json is damaged" in \
        result.stderr.splitlines()
    assert store.read_array(out / "inputs").shape == (40, 64) and not partial.exists()


def test_sigterm_during_encode_exits_143_keeps_the_partial_and_resumes_to_the_same_bytes(run_and_data, tmp_path,
                                                                                         run_cli):
    run, data = run_and_data
    args = ["encode-latents", run, data, "--mesh", "data=1", "--batch-size", "16", "-q"]
    assert run_cli(*args, "-o", tmp_path / "whole.zarr").exit_code == 0
    out, partial = tmp_path / "emb.zarr", tmp_path / ".emb.zarr.partial"
    # held once every batch is written, before the unit is recorded as done: the rerun must recompute it
    process = start_held(tmp_path / "held", "jepa_cli.data.resumable:mark_unit", "before", *args, "-o", out)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, (process.returncode, stderr)
    assert stderr.decode().splitlines() == ["jepa: error: terminated (SIGTERM)"]
    assert (partial / "inputs").exists() and not out.exists()
    resumed = run_cli(*args, "-o", out, "--json")
    assert resumed.exit_code == 0, resumed.stderr
    assert json.loads(resumed.stdout)["units_resumed"] == 0 and not partial.exists()
    np.testing.assert_array_equal(store.read_array(out / "inputs"), store.read_array(tmp_path / "whole.zarr" / "inputs"))


def test_encode_into_an_output_another_encode_is_writing_is_one_line_and_touches_nothing(run_and_data, tmp_path):
    run, data = run_and_data
    out = tmp_path / "emb.zarr"
    partial = tmp_path / ".emb.zarr.partial"
    holder = subprocess.Popen(  # a first encode-latents at work, as the kernel sees it: the partial, locked
        [sys.executable, "-c", "import fcntl, os, time\n"
         f"os.mkdir({str(partial)!r}); fd = os.open({str(partial)!r}, os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX)\n"
         "print('held', flush=True); time.sleep(600)"], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"held\n"
        expect_refusal("encode-latents", run, data, "-o", out, "--mesh", "data=1", guard=[tmp_path],
                       fragments=[f"{out}: another process is writing it now"])
    finally:
        holder.kill()
        holder.wait()


def test_probe_of_sets_from_different_runs_is_refused(tmp_path):
    rng = np.random.default_rng(0)
    sets = []
    for name, run in (("tr.zarr", "/runs/a"), ("te.zarr", "/runs/b")):
        path = tmp_path / name
        store.write_group(path, store.base_attributes(
            "dataset", modality="latent", layout="ND", class_names=[], source="x", num_samples=20,
            provenance={"run": run, "step": 1, "weights": "target", "pool": "mean", "layers": "last"}))
        store.write_array(path / "inputs", rng.normal(size=(20, 4)).astype(np.float32))
        store.write_array(path / "labels", (np.arange(20) % 2).astype(np.int32))
        sets.append(path)
    expect_refusal("probe", "linear", *sets, guard=[tmp_path],
                   fragments=["not encoded alike", 'run "/runs/a" vs "/runs/b"', "--allow-mismatch"])


def test_probe_of_a_truncated_chunk_names_the_array_and_chunk(tmp_path):
    path = tmp_path / "tr.zarr"
    store.write_group(path, store.base_attributes("dataset", modality="latent", layout="ND", class_names=[],
                                                  source="x", num_samples=20))
    store.write_array(path / "inputs", np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32))
    store.write_array(path / "labels", (np.arange(20) % 2).astype(np.int32))
    chunk = next(p for p in (path / "inputs").rglob("*") if p.is_file() and p.name != "zarr.json")
    chunk.write_bytes(chunk.read_bytes()[:10])
    expect_refusal("probe", "knn", path, path, "--k", "3", guard=[tmp_path], fragments=["tr.zarr/inputs: chunk"])
