"""The anti-collapse terms (var_weight, var_target, cov_weight), declared once with I-JEPA's options and
taken by every JEPA objective (objectives/ijepa_config.py JEPA_OBJECTIVES, telemetry.with_anticollapse),
and the collapse telemetry and training-time k-NN of audio and video runs."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_user_error
from jepa_cli.data import store
from jepa_cli.errors import InputError
from jepa_cli.objectives import make_objective
from jepa_cli.objectives.audio_jepa_config import AudioJEPAConfig
from jepa_cli.objectives.ijepa_config import IJEPAConfig
from jepa_cli.objectives.telemetry import covariance_penalty, variance_hinge
from jepa_cli.objectives.vjepa import VJEPAConfig

VIDEO = dict(model="tiny", width=24, depth=1, heads=2, patch_size=4, image_size=8, channels=1, num_frames=4,
             tubelet_size=2, pred_depth=1, pred_width=16, npred=[1, 1], pred_scale=[[0.25, 0.25], [0.5, 0.5]])
AUDIO = dict(model="tiny", width=32, depth=1, heads=2, pred_width=16, pred_depth=1, pred_heads=2, patch_size=4,
             sample_rate=8000, seconds=0.5, frames=16, mel_bins=16, fmax=4000.0)
CASES = {"vjepa": (VIDEO, "video", lambda rng: rng.normal(size=(4, 4, 8, 8, 1)).astype(np.float32)),
         "audio-jepa": (AUDIO, "audio", lambda rng: rng.normal(size=(4, 4000)).astype(np.float32))}


def _loss(name: str, **extra):
    options, key, make = CASES[name]
    objective = make_objective(name, {**options, **extra})
    params = objective.init(jax.random.key(0))
    batch = {key: jnp.asarray(make(np.random.default_rng(0)))}
    return jax.jit(lambda p: objective.loss(p, p["encoder"], batch, jax.random.key(1), jnp.int32(0)))(params)


def test_the_three_options_are_declared_once_with_i_jepa_s_help():
    for name in ("var_weight", "var_target", "cov_weight"):
        fields = [{f.name: f for f in dataclasses.fields(cls)}[name]
                  for cls in (IJEPAConfig, VJEPAConfig, AudioJEPAConfig)]
        assert fields[0].metadata == fields[1].metadata == fields[2].metadata
        assert fields[0].metadata["applies"] == ("ijepa", "vjepa", "audio-jepa")


@pytest.mark.parametrize("name", ["vjepa", "audio-jepa"])
def test_off_by_default_the_loss_has_no_regulariser_terms(name):
    value, aux = _loss(name)
    assert not {"var_loss", "cov_loss", "pred_loss"} & set(aux)
    assert float(aux["loss"]) == float(value)


@pytest.mark.parametrize("name", ["vjepa", "audio-jepa"])
def test_the_weights_add_their_terms_to_the_prediction_loss(name):
    official, _ = _loss(name)
    value, aux = _loss(name, var_weight=0.5, var_target=2.0, cov_weight=0.25)
    assert float(aux["pred_loss"]) == float(official)  # the same masks and weights: the same prediction loss
    assert float(aux["var_loss"]) > 1.0  # pooled features of a random encoder: batch std far below 2
    expected = float(official) + 0.5 * float(aux["var_loss"]) + 0.25 * float(aux["cov_loss"])
    assert float(value) == pytest.approx(expected, rel=1e-6)


def test_the_terms_are_vicreg_s_on_the_pooled_features():
    z = jnp.array([[0.0, 1.0], [2.0, 1.0]])  # stds (ddof 1) sqrt(2) and 0; covariance off-diagonal 0
    assert float(variance_hinge(z, 2.0)) == pytest.approx(((2 - np.sqrt(2.0001)) + (2 - np.sqrt(1e-4))) / 2, rel=1e-6)
    assert float(covariance_penalty(z)) == 0.0


def test_the_covariance_term_is_the_squared_off_diagonal_of_the_centred_batch_covariance_over_d():
    from jepa_cli.objectives.telemetry import repr_cov_offdiag

    # centred: [[1, 0], [0, 1], [-1, -1]]; C = zc^T zc / 2 = [[1, 0.5], [0.5, 1]]; off-diagonal squares 0.5
    z = jnp.array([[2.0, 0.0], [1.0, 1.0], [0.0, -1.0]])
    assert float(covariance_penalty(z)) == pytest.approx(0.5 / 2, rel=1e-6)  # over D = 2
    assert float(repr_cov_offdiag(z)) == pytest.approx(np.sqrt(0.5 / 2), rel=1e-6)  # over D (D - 1) = 2


@pytest.mark.parametrize("name, options", [("vjepa", VIDEO), ("audio-jepa", AUDIO)])
@pytest.mark.parametrize("key, value, message", [
    ("var_weight", -0.5, "var_weight must be >= 0, got -0.5"),
    ("cov_weight", -1.0, "cov_weight must be >= 0, got -1.0"),
    ("var_target", 0.0, "var_target must be > 0"),
    ("var_target", -1.0, "var_target must be >= 0, got -1.0"),
])
def test_a_negative_weight_or_a_var_target_not_above_zero_is_refused(name, options, key, value, message):
    with pytest.raises(InputError, match=message):
        make_objective(name, {**options, key: value})


def _dataset(path, modality: str, n: int = 16):
    rng = np.random.default_rng(0)
    if modality == "audio":
        inputs, layout, extra = rng.normal(0, 0.3, (n, 4000)).astype(np.float32), "NS", {"sample_rate": 8000,
                                                                                           "seconds": 0.5}
    else:
        inputs, layout, extra = rng.integers(0, 256, (n, 4, 8, 8, 1), dtype=np.uint8), "NTHWC", {"frames": 4}
    store.write_group(path, store.base_attributes("dataset", modality=modality, layout=layout,
                                                  class_names=["a", "b"], **extra))
    store.write_array(path / "inputs", inputs)
    store.write_array(path / "labels", np.arange(n, dtype=np.int32) % 2)
    return path


def _recipe(path, name: str, table: dict, **top):
    def text(v):
        return json.dumps(v)  # numbers, strings and lists read the same in TOML

    lines = [f'objective = "{name}"'] + [f"{k} = {text(v)}" for k, v in top.items()] + [f'["{name}"]']
    lines += [f"{k} = {text(v)}" for k, v in table.items() if k not in ("sample_rate", "seconds", "channels",
                                                                        "num_frames")]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("name, modality", [("audio-jepa", "audio"), ("vjepa", "video")])
def test_a_tiny_run_logs_the_collapse_telemetry_the_terms_and_the_k_nn_probe(run_cli, tmp_path, name, modality):
    data = _dataset(tmp_path / "d.zarr", modality)
    options = {**CASES[name][0], "var_weight": 1.0, "cov_weight": 0.04}
    recipe = _recipe(tmp_path / "r.toml", name, options, steps=2, batch_size=8, warmup_steps=1, log_every=1, mesh="data=1")
    result = run_cli("train", "--config", recipe, "--data", data, "--out", tmp_path / "run", "--probe-every", "2",
                     "--probe-data", f"{data},{data}", "--probe-k", "3", "--quiet")
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert set(rows[0]) >= {"knn_top1"} and 0.0 <= rows[0]["knn_top1"] <= 1.0  # the initialisation's probe
    trained = rows[-1]
    assert {"repr_std", "repr_cov_offdiag", "target_std", "effective_rank", "var_loss", "cov_loss", "pred_loss",
            "knn_top1"} <= set(trained)
    assert 1.0 <= trained["effective_rank"] <= 7.0  # in [1, B - 1] for a batch of 8
    assert trained["loss"] == pytest.approx(trained["pred_loss"] + trained["var_loss"] + 0.04 * trained["cov_loss"],
                                            rel=1e-5)
    config = json.loads((tmp_path / "run" / "run.json").read_text())["config"]["objective_config"]
    assert (config["var_weight"], config["var_target"], config["cov_weight"]) == (1.0, 1.0, 0.04)


@pytest.mark.slow
@pytest.mark.parametrize("name, modality", [("audio-jepa", "audio"), ("vjepa", "video")])
@pytest.mark.parametrize("extra, fragments", [
    ({"eval_resize_ratio": 1.0}, ("unknown", "option 'eval_resize_ratio'")),  # I-JEPA's, taken by no other
    ({"var_weight": -1.0}, ("var_weight must be >= 0, got -1.0",)),
    ({"var_target": 0.0}, ("var_target must be > 0",)),
])
def test_bad_anticollapse_or_foreign_recipe_keys_exit_2_and_write_nothing(run_cli, tmp_path, name, modality, extra,
                                                                          fragments):
    data = _dataset(tmp_path / "d.zarr", modality)
    recipe = _recipe(tmp_path / "r.toml", name, {**CASES[name][0], **extra}, steps=1, batch_size=8)
    result = run_cli("train", "--config", recipe, "--data", data, "--out", tmp_path / "run")
    assert_user_error(result, *fragments)
    assert not (tmp_path / "run").exists()


def test_the_flags_name_every_jepa_objective_in_their_help(run_cli):
    text = " ".join(run_cli("train", "--help").stdout.split())
    assert "(VICReg's gamma), > 0. [ijepa/vjepa/audio-jepa; default 1.0]" in text
