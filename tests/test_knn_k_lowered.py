"""A k-NN probe whose k exceeds the training set's size (a tiny set with the default --k 20): `jepa
probe knn`, with or without --run, lowers k to the number of training samples with one warning line
and reports the k used; `jepa train --probe-k` refuses at the start, saying what to pass."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jepa_cli.data import store

pytestmark = pytest.mark.slow


def _dataset(path, inputs, labels, modality="latent", layout="ND"):
    store.write_group(path, store.base_attributes("dataset", modality=modality, layout=layout, class_names=[]))
    store.write_array(path / "inputs", np.asarray(inputs))
    store.write_array(path / "labels", np.asarray(labels, np.int32))
    return path


def test_knn_probe_lowers_k_to_the_training_set_with_a_warning(tmp_path, run_cli):
    rng = np.random.default_rng(0)
    train = _dataset(tmp_path / "train.zarr", rng.normal(size=(12, 8)).astype(np.float32), np.arange(12) % 3)
    result = run_cli("probe", "knn", train, train, "--json")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines() == [f"jepa: warning: --k 20 is more than the 12 samples of {train}: the "
                                          "k-NN probe used k=12, every training sample"]
    lowered = json.loads(result.stdout)
    assert lowered["k"] == 12
    as_given = json.loads(run_cli("probe", "knn", train, train, "--k", "12", "--json").stdout)
    assert lowered["top1"] == as_given["top1"]


def test_a_k_within_the_training_set_warns_nothing(tmp_path, run_cli):
    rng = np.random.default_rng(0)
    train = _dataset(tmp_path / "train.zarr", rng.normal(size=(12, 8)).astype(np.float32), np.arange(12) % 3)
    result = run_cli("probe", "knn", train, train, "--k", "12", "--json")
    assert (result.exit_code, result.stderr, json.loads(result.stdout)["k"]) == (0, "", 12)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """An 8-image labelled dataset and what `load_run` hands back for a freshly initialised I-JEPA run
    of the digits recipe (no checkpoint needed)."""
    import jax

    from jepa_cli.objectives import make_objective
    from jepa_cli.training.config import load_toml

    root = tmp_path_factory.mktemp("knn-k")
    images = _dataset(root / "images.zarr", np.zeros((8, 16, 16, 1), np.uint8), np.arange(8) % 2, "image", "NHWC")
    config = load_toml("builtin:ijepa-digits-tiny")["objective_config"]
    objective = make_objective("ijepa", config)
    run = root / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    host = {"ema": objective.init(jax.random.key(0))["encoder"], "params": {}}
    return images, run, ({"objective": "ijepa", "objective_config": config}, objective, host, 0)


def test_probe_run_lowers_k_to_the_training_set_with_a_warning(tiny_run, run_cli, monkeypatch):
    from jepa_cli.training import run as run_module

    images, run, loaded = tiny_run
    monkeypatch.setattr(run_module, "load_run", lambda run_dir, step=None, on_fallback=None: loaded)
    result = run_cli("probe", "knn", images, images, "--run", run, "--json")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines() == [f"jepa: warning: --k 20 is more than the 8 samples of {images}: the "
                                          "k-NN probe used k=8, every training sample"]
    out = json.loads(result.stdout)
    assert (out["k"], out["results"][0]["k"]) == (8, 8)


def test_train_refuses_a_probe_k_above_the_probe_set_saying_what_to_pass(tiny_run):
    from jepa_cli.errors import InputError
    from jepa_cli.evaluation.online import OnlineProbe

    images, _run, (_config, objective, _host, _step) = tiny_run
    with pytest.raises(InputError) as refused:
        OnlineProbe(objective, images, images, k=20, image_size=16, channels=1)
    assert str(refused.value) == (f"--probe-data: {images}: 8 samples, fewer than the k-NN probe's k=20: pass "
                                  "--probe-k 8 or fewer, or a larger training set")
