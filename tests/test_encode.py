"""`jepa encode-latents`: resumable chunked writing, provenance and shift/scale, sharding, bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import assert_user_error
from jepa_cli.data import store

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "jepa_cli" / "recipes" / "ijepa-digits-tiny.toml"


def image_dataset(path, n=40, size=16, seed=0, labels=True, channels=1):
    store.write_group(path, store.base_attributes("dataset", modality="image", layout="NHWC", class_names=["a", "b", "c"],
                                                  source="test", split=None, num_samples=n))
    store.write_array(path / "inputs",
                      np.random.default_rng(seed).integers(0, 256, (n, size, size, channels)).astype(np.uint8))
    if labels:
        store.write_array(path / "labels", (np.arange(n) % 3).astype(np.int32))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real run of the tiny recipe with one checkpoint (step 0: initialisation) and a dataset."""
    from jepa_cli.cli.main import cli

    root = tmp_path_factory.mktemp("encode")
    data = image_dataset(root / "data.zarr")
    result = CliRunner().invoke(cli, ["train", "--config", str(RECIPE), "--data", str(data), "--out", str(root / "run"),
                                      "--steps", "0", "--batch-size", "8", "--mesh", "data=1", "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return root / "run", data


def stand_in_encoder(params, images):
    """images [B, 16, 16, 1] -> tokens [B, 16, 8]: 4x4 patches through a fixed projection."""
    import jax.numpy as jnp

    b = images.shape[0]
    patches = images.reshape(b, 4, 4, 4, 4).transpose(0, 1, 3, 2, 4).reshape(b, 16, 16)
    return jnp.tanh(patches @ params["w"] + params["b"])


def stand_in_params():
    rng = np.random.default_rng(7)
    return {"w": rng.normal(size=(16, 8)).astype(np.float32) * 0.05, "b": rng.normal(size=(8,)).astype(np.float32)}


class Interrupt(Exception):
    pass


def test_resume_after_interruption_equals_uninterrupted(tmp_path):
    from jepa_cli.evaluation.encode import encode_dataset, partial_path

    data = image_dataset(tmp_path / "data.zarr", n=50)
    params = stand_in_params()
    kw = dict(pool="none", batch_size=6, chunk_n=4, job={"what": "stand-in"})
    whole = encode_dataset(data, tmp_path / "whole.zarr", stand_in_encoder, params, **kw)
    assert whole["units"] == 7  # units of two 4-row chunks (>= one 6-row batch)

    seen = []

    def stop_after_three_units(rows):
        seen.append(rows)
        if sum(seen) >= 30:  # mid-way through the fourth unit (rows 24-32)
            raise Interrupt

    out = tmp_path / "resumed.zarr"
    with pytest.raises(Interrupt):
        encode_dataset(data, out, stand_in_encoder, params, on_progress=stop_after_three_units, **kw)
    assert not out.exists() and partial_path(out).exists()

    counted = []
    resumed = encode_dataset(data, out, stand_in_encoder, params, on_progress=counted.append, **kw)
    assert resumed["units_resumed"] == 3 and sum(counted) == 50 - 24
    assert not partial_path(out).exists()
    np.testing.assert_array_equal(store.read_array(out / "inputs"), store.read_array(tmp_path / "whole.zarr" / "inputs"))
    a, b = store.read_attributes(out), store.read_attributes(tmp_path / "whole.zarr")
    assert a["latent_shift"] == b["latent_shift"] and a["latent_scale"] == b["latent_scale"]

    # a different job does not reuse a stale partial
    with pytest.raises(Interrupt):
        encode_dataset(data, tmp_path / "x.zarr", stand_in_encoder, params, on_progress=stop_after_three_units, **kw)
    other = encode_dataset(data, tmp_path / "x.zarr", stand_in_encoder, params, **(kw | {"job": {"what": "else"}}))
    assert other["units_resumed"] == 0


def _interrupted_partial(data, out, **kw):
    """Encodes `data` into `out` with the stand-in encoder and stops mid-way (30 of its rows)."""
    from jepa_cli.evaluation.encode import encode_dataset, partial_path

    seen = []

    def stop_after_three_units(rows):
        seen.append(rows)
        if sum(seen) >= 30:
            raise Interrupt

    with pytest.raises(Interrupt):
        encode_dataset(data, out, stand_in_encoder, stand_in_params(), on_progress=stop_after_three_units, **kw)
    return partial_path(out)


ENCODE_KW = dict(pool="none", batch_size=6, chunk_n=4, job={"what": "stand-in"})


def test_resume_after_the_source_was_reingested_never_mixes_old_and_new(tmp_path):
    from jepa_cli.evaluation.encode import encode_dataset

    data = image_dataset(tmp_path / "data.zarr", n=50, seed=0)
    out = tmp_path / "emb.zarr"
    _interrupted_partial(data, out, **ENCODE_KW)
    os.rename(data, tmp_path / "old.zarr")  # re-ingest: the same path, shape and labels, other pixels
    image_dataset(data, n=50, seed=1)
    logs = []
    resumed = encode_dataset(data, out, stand_in_encoder, stand_in_params(), on_log=logs.append, **ENCODE_KW)
    fresh = encode_dataset(data, tmp_path / "fresh.zarr", stand_in_encoder, stand_in_params(), **ENCODE_KW)
    assert resumed["units_resumed"] == 0
    assert len(logs) == 1 and "changed since it was started" in logs[0]
    np.testing.assert_array_equal(store.read_array(out / "inputs"), store.read_array(tmp_path / "fresh.zarr" / "inputs"))
    assert fresh["units_resumed"] == 0


def test_a_damaged_progress_file_is_recomputed_not_trusted(tmp_path):
    from jepa_cli.evaluation.encode import encode_dataset

    data = image_dataset(tmp_path / "data.zarr", n=50)
    whole = encode_dataset(data, tmp_path / "whole.zarr", stand_in_encoder, stand_in_params(), **ENCODE_KW)
    out = tmp_path / "emb.zarr"
    partial = _interrupted_partial(data, out, **ENCODE_KW)
    marker = partial / "progress" / "00000001.npz"
    marker.write_bytes(marker.read_bytes()[:40])  # truncated
    logs = []
    resumed = encode_dataset(data, out, stand_in_encoder, stand_in_params(), on_log=logs.append, **ENCODE_KW)
    assert resumed["units_resumed"] == 2 and whole["units"] == resumed["units"] == 7
    assert len(logs) == 1 and "00000001.npz: damaged progress file removed" in logs[0]
    np.testing.assert_array_equal(store.read_array(out / "inputs"), store.read_array(tmp_path / "whole.zarr" / "inputs"))
    assert store.read_attributes(out)["latent_shift"] == store.read_attributes(tmp_path / "whole.zarr")["latent_shift"]


def test_a_damaged_job_file_discards_the_partial(tmp_path):
    from jepa_cli.evaluation.encode import encode_dataset

    data = image_dataset(tmp_path / "data.zarr", n=50)
    out = tmp_path / "emb.zarr"
    partial = _interrupted_partial(data, out, **ENCODE_KW)
    (partial / "job.json").write_text("{not json")
    logs = []
    resumed = encode_dataset(data, out, stand_in_encoder, stand_in_params(), on_log=logs.append, **ENCODE_KW)
    assert resumed["units_resumed"] == 0
    assert logs == [f"discarding the partial output {partial}: its job.json is damaged"]


def test_encode_latents_cli_provenance_shift_scale(trained, tmp_path, run_cli):
    run, data = trained
    out = tmp_path / "emb.zarr"
    result = run_cli("encode-latents", run, data, "-o", out, "--batch-size", "16", "--mesh", "data=1", "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["shape"] == [40, 64] and summary["step"] == 0 and summary["weights"] == "target"

    attrs = store.read_attributes(out)
    assert attrs["jepa_kind"] == "dataset" and attrs["modality"] == "latent" and attrs["layout"] == "ND"
    prov = attrs["provenance"]
    assert prov["run"] == str(run.resolve()) and prov["step"] == 0 and prov["weights"] == "target"
    assert prov["objective"] == "ijepa" and prov["model"]["width"] == 64 and prov["model"]["depth"] == 4
    assert prov["source"] == str(data.resolve()) and prov["pool"] == "mean" and prov["layers"] == "last"
    z = store.read_array(out / "inputs")
    np.testing.assert_allclose(attrs["latent_shift"], z.mean(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(attrs["latent_scale"], 1 / z.std(axis=0, dtype=np.float64), rtol=1e-4)
    normalised = (z - np.array(attrs["latent_shift"])) * np.array(attrs["latent_scale"])
    np.testing.assert_allclose(normalised.std(axis=0), 1.0, rtol=1e-3)
    np.testing.assert_array_equal(store.read_array(out / "labels"), store.read_array(data / "labels"))
    assert attrs["class_names"] == ["a", "b", "c"]

    # the target (EMA) and context encoders are the same at step 0; tokens and last4 change the shape
    tokens = tmp_path / "tok.zarr"
    result = run_cli("encode-latents", run, data, "-o", tokens, "--pool", "none", "--layers", "last4",
                     "--weights", "context", "--mesh", "data=1", "-q")
    assert result.exit_code == 0, result.stderr
    t = store.read_array(tokens / "inputs")
    assert t.shape == (40, 64, 256) and store.read_attributes(tokens)["layout"] == "NTD"  # 8x8 patch grid
    np.testing.assert_allclose(t[:, :, -64:].mean(axis=1), z, rtol=1e-4, atol=1e-5)
    tok_attrs = store.read_attributes(tokens)
    np.testing.assert_allclose(tok_attrs["latent_shift"], t.reshape(-1, 256).mean(axis=0), rtol=1e-4, atol=1e-5)

    # the output feeds the probes, and an existing output needs --force
    probe = run_cli("probe", "knn", out, out, "--k", "5", "--json")
    assert probe.exit_code == 0, probe.stderr
    assert_user_error(run_cli("encode-latents", run, data, "-o", out), "already exists")
    assert run_cli("encode-latents", run, data, "-o", out, "--force", "--mesh", "data=1", "-q").exit_code == 0


def test_weights_encodes_with_the_target_or_the_context_encoder(trained, tmp_path, run_cli, monkeypatch):
    """The two encoders are equal at step 0, so the target's final LayerNorm bias is shifted by 1 as the
    run is loaded: the target's mean-pooled embeddings are then the context's plus 1 in every feature."""
    from jepa_cli.training import run as run_module

    run, data = trained
    load_run = run_module.load_run

    def load_with_shifted_target(*args, **kwargs):
        config, objective, host, step = load_run(*args, **kwargs)
        norm = host["ema"]["norm"]
        return config, objective, {**host, "ema": {**host["ema"], "norm": {**norm, "bias": norm["bias"] + 1}}}, step

    monkeypatch.setattr(run_module, "load_run", load_with_shifted_target)
    z = {}
    for weights in ("context", "target"):
        result = run_cli("encode-latents", run, data, "-o", tmp_path / weights, "--weights", weights, "--mesh", "data=1",
                         "-q")
        assert result.exit_code == 0, result.stderr
        z[weights] = store.read_array(tmp_path / weights / "inputs")
    np.testing.assert_allclose(z["target"], z["context"] + 1, atol=1e-5)


def test_encoding_on_8_simulated_devices_equals_one(tmp_path):
    import jax

    from jepa_cli.evaluation.encode import encode_dataset
    from jepa_cli.objectives import make_objective
    from jepa_cli.training.mesh import make_mesh

    assert jax.device_count() == 8  # tests/conftest.py
    image_dataset(tmp_path / "data.zarr", n=30)
    obj = make_objective("ijepa", {"model": "tiny", "depth": 2, "width": 32, "heads": 2, "patch_size": 4,
                                   "image_size": 16, "channels": 1})
    params = obj.init(jax.random.key(0))["encoder"]
    outs, batch_sizes = {}, {}
    for name, mesh in [("one", None), ("data8", make_mesh("data=8"))]:
        report = encode_dataset(tmp_path / "data.zarr", tmp_path / f"{name}.zarr", obj.encode, params,
                                obj.eval_transform(None), pool="none", batch_size=12, mesh=mesh)
        outs[name], batch_sizes[name] = store.read_array(tmp_path / f"{name}.zarr" / "inputs"), report["batch_size"]
    assert batch_sizes["data8"] == 16 and outs["data8"].shape == (30, 16, 32)  # 12 rounded up to the 8 devices
    np.testing.assert_allclose(outs["data8"], outs["one"], rtol=1e-5, atol=1e-5)


def test_bad_input_exits_2(trained, tmp_path, run_cli, monkeypatch):
    run, data = trained
    out = tmp_path / "o.zarr"
    assert_user_error(run_cli("encode-latents", tmp_path / "nowhere", data, "-o", out), "nowhere")
    (tmp_path / "notrun").mkdir()
    assert_user_error(run_cli("encode-latents", tmp_path / "notrun", data, "-o", out), "not a training run")
    empty = tmp_path / "empty-run"
    empty.mkdir()
    (empty / "run.json").write_text((run / "run.json").read_text())
    assert_user_error(run_cli("encode-latents", empty, data, "-o", out), "no checkpoint")
    assert_user_error(run_cli("encode-latents", run, data, "-o", out, "--step", "5"), "no checkpoint at step 5")
    assert_user_error(run_cli("encode-latents", run, tmp_path / "missing.zarr", "-o", out), "missing.zarr")
    rgb = tmp_path / "rgb.zarr"
    store.write_group(rgb, store.read_attributes(data))
    store.write_array(rgb / "inputs", np.zeros((4, 16, 16, 3), np.uint8))
    assert_user_error(run_cli("encode-latents", run, rgb, "-o", out), "rgb.zarr: images have 3 channel(s)",
                      "trained on 1", "--channels 1")
    assert not out.exists()

    # a checkpoint of an objective without an encoder
    import jepa_cli.training.run as runlib

    class NoEncoder:
        name = "toy-no-encoder"

    monkeypatch.setattr(runlib, "load_run", lambda run_dir, step=None, **_: ({"objective": "toy"}, NoEncoder(),
                                                                        {"params": {"w": np.zeros(2)}, "ema": None}, 3))
    assert_user_error(run_cli("encode-latents", run, data, "-o", out), "has no encoder")


def _swallowed_sigterm_at(row: int) -> tuple[list[int], Callable[[int], None]]:
    """(rows seen, an on_progress callback): at `row` rows the callback takes a SIGTERM whose exception
    it swallows, as a callback whose errors Python only prints ("Exception ignored in": JAX's
    garbage-collection hook) does."""
    import signal

    from jepa_cli.errors import Terminated, raise_terminated

    seen: list[int] = []

    def on_progress(rows: int) -> None:
        seen.append(rows)
        if sum(seen) == row:
            try:
                raise_terminated(signal.SIGTERM, None)
            except Terminated:
                pass

    return seen, on_progress


def test_a_signal_whose_exception_a_callback_swallowed_stops_at_the_next_unit_and_keeps_the_partial(tmp_path):
    from jepa_cli.errors import Terminated
    from jepa_cli.evaluation.encode import encode_dataset, partial_path

    data = image_dataset(tmp_path / "data.zarr", n=50)
    seen, on_progress = _swallowed_sigterm_at(6)
    out = tmp_path / "emb.zarr"
    with pytest.raises(Terminated):
        encode_dataset(data, out, stand_in_encoder, stand_in_params(), on_progress=on_progress, **ENCODE_KW)
    assert sum(seen) == 8  # the first unit (two 4-row chunks) finished, the second never started
    assert not out.exists() and sorted(p.name for p in (partial_path(out) / "progress").iterdir()) == ["00000000.npz"]


def test_a_swallowed_signal_in_the_last_unit_never_commits_the_output(tmp_path):
    from jepa_cli.errors import Terminated
    from jepa_cli.evaluation.encode import encode_dataset, partial_path

    data = image_dataset(tmp_path / "data.zarr", n=8)  # one unit
    _, on_progress = _swallowed_sigterm_at(8)
    out = tmp_path / "emb.zarr"
    with pytest.raises(Terminated):
        encode_dataset(data, out, stand_in_encoder, stand_in_params(), on_progress=on_progress, **ENCODE_KW)
    assert not out.exists() and (partial_path(out) / "progress" / "00000000.npz").exists()


def test_a_second_writer_of_an_output_is_refused_while_a_live_process_holds_its_partial(tmp_path):
    """Two encode-latents of one output at once: the second is refused and the first's partial output
    is left as it was; once the first process is gone its partial is taken over (here: discarded)."""
    from adversarial import snapshot

    from jepa_cli.errors import InputError
    from jepa_cli.evaluation.encode import encode_dataset, partial_path

    data = image_dataset(tmp_path / "data.zarr", n=16)
    out = tmp_path / "emb.zarr"
    partial = partial_path(out)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, time\n"  # what a first writer holds, as the kernel sees it
         f"os.mkdir({str(partial)!r}); fd = os.open({str(partial)!r}, os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX)\n"
         f"open({str(partial / 'job.json')!r}, 'w').write('the first writer is here')\n"
         "print('held', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout.readline() == b"held\n"
        before = snapshot([tmp_path])
        with pytest.raises(InputError, match=f"{out}: another process is writing it now"):
            encode_dataset(data, out, stand_in_encoder, stand_in_params(), **ENCODE_KW)
        assert snapshot([tmp_path]) == before
    finally:
        holder.kill()
        holder.wait()
    logs = []
    summary = encode_dataset(data, out, stand_in_encoder, stand_in_params(), on_log=logs.append, **ENCODE_KW)
    assert summary["units_resumed"] == 0 and logs == [f"discarding the partial output {partial}: its job.json is damaged"]


def test_a_symbolic_link_in_place_of_the_partial_output_is_refused_and_its_target_kept(tmp_path):
    from jepa_cli.errors import InputError
    from jepa_cli.evaluation.encode import encode_dataset, partial_path

    data = image_dataset(tmp_path / "data.zarr", n=8)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    out = tmp_path / "emb.zarr"
    partial_path(out).symlink_to(mine)
    with pytest.raises(InputError, match="is not a partial output"):
        encode_dataset(data, out, stand_in_encoder, stand_in_params(), **ENCODE_KW)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and not out.exists()
