"""Where the JEPA objectives' SIGReg applies (`sigreg_on`): the statistic over the valid rows of a
masked set, the pooled context features (the default), every valid context token, every valid
predicted token, and the option's declaration and its refusal of an unknown value."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_user_error

from jepa_cli.errors import InputError
from jepa_cli.objectives import IJEPAConfig, IJEPAObjective, make_objective
from jepa_cli.objectives.audio_jepa_config import AudioJEPAConfig
from jepa_cli.objectives.lejepa_config import LeJEPAConfig
from jepa_cli.objectives.sigreg import sigreg
from jepa_cli.objectives.telemetry import SIGREG_STREAM, sigreg_samples, with_anticollapse
from jepa_cli.objectives.vjepa import VJEPAConfig

# -- the statistic over a masked set of rows -------------------------------------------------------


def test_the_statistic_over_valid_rows_is_the_statistic_of_those_rows_alone():
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(12, 5)).astype(np.float32)
    rows[[1, 4, 5, 9]] *= 40.0  # the invalid rows, far from a normal: counted, they would dominate
    valid = np.ones(12, bool)
    valid[[1, 4, 5, 9]] = False
    key = jax.random.key(3)
    expected = float(sigreg(rows[valid], key, 64))  # 8 rows selected by numpy
    got = float(sigreg(rows, key, 64, valid=valid))
    assert got == pytest.approx(expected, rel=1e-5)
    assert float(sigreg(rows, key, 64)) > 2 * expected  # the invalid rows do change the unmasked value


def test_with_every_row_valid_it_is_the_unmasked_statistic():
    rows = jax.random.normal(jax.random.key(0), (10, 4)) * 3.0
    key = jax.random.key(1)
    got = float(sigreg(rows, key, 32, valid=jnp.ones(10, bool)))
    assert got == pytest.approx(float(sigreg(rows, key, 32)), rel=1e-6)


def test_with_no_valid_row_it_is_zero():
    assert float(sigreg(jnp.ones((6, 3)), jax.random.key(0), 8, valid=jnp.zeros(6, bool))) == 0.0


# -- the option -------------------------------------------------------------------------------------


def test_the_option_is_declared_once_for_the_jepa_objectives_with_pooled_by_default():
    fields = [{f.name: f for f in dataclasses.fields(cls)}["sigreg_on"]
              for cls in (IJEPAConfig, VJEPAConfig, AudioJEPAConfig)]
    assert fields[0].metadata == fields[1].metadata == fields[2].metadata
    assert fields[0].metadata["applies"] == ("ijepa", "vjepa", "audio-jepa")
    assert fields[0].metadata["choices"] == ("pooled", "tokens", "predictions")
    assert fields[0].default == fields[1].default == fields[2].default == "pooled"
    assert "sigreg_on" not in {f.name for f in dataclasses.fields(LeJEPAConfig)}  # no predictor, no tokens


@pytest.mark.parametrize("name", ["ijepa", "vjepa", "audio-jepa"])
def test_an_unknown_placement_in_a_recipe_is_refused_in_one_line(name):
    with pytest.raises(InputError, match="unknown sigreg_on 'mean' \\(choose from pooled, tokens, predictions\\)") \
            as info:
        make_objective(name, {"sigreg_on": "mean"})
    assert "\n" not in str(info.value)


def test_an_unknown_placement_on_the_command_line_exits_2_in_one_line(run_cli, tmp_path):
    result = run_cli("train", "--data", tmp_path / "missing.zarr", "--out", tmp_path / "run",
                     "--sigreg-on", "mean")
    assert_user_error(result, "--sigreg-on", "pooled, tokens, predictions", "'mean'")
    assert not (tmp_path / "run").exists()


# -- the samples each placement takes --------------------------------------------------------------

B, C, K, M, T, D = 3, 1, 4, 2, 3, 5


def placement_inputs():
    """pooled [B, D], context [B, C, K, D] with its last slot padding, predictions [B, M, T, D] with
    one padded slot per example, the padding 100 times larger than the rest."""
    rng = np.random.default_rng(1)
    context = rng.normal(size=(B, C, K, D)).astype(np.float32)
    context_valid = np.ones((B, C, K), bool)
    context_valid[..., -1] = False
    context[~context_valid] *= 100.0
    predictions = rng.normal(size=(B, M, T, D)).astype(np.float32)
    target_valid = np.ones((B, M, T), bool)
    target_valid[:, 1, 2] = False
    predictions[~target_valid] *= 100.0
    pooled = rng.normal(size=(B, D)).astype(np.float32)
    return pooled, context, context_valid, predictions, target_valid


def config(**options):
    return IJEPAConfig(sigreg_weight=0.25, sigreg_slices=32, **options)


@pytest.mark.parametrize("placement, expected_rows", [
    ("tokens", lambda p, c, cv, z, tv: c[cv]),          # the 9 valid context tokens
    ("predictions", lambda p, c, cv, z, tv: z[tv]),     # the 15 valid predicted tokens
])
def test_a_token_placement_adds_weight_times_sigreg_of_its_valid_tokens(placement, expected_rows):
    inputs = placement_inputs()
    key = jax.random.key(4)
    rows = expected_rows(*inputs)  # numpy selection, rows in order
    expected = float(sigreg(rows, jax.random.fold_in(key, SIGREG_STREAM), 32))
    value, aux = with_anticollapse(jnp.float32(0.5), inputs[0], config(sigreg_on=placement), key,
                                   *sigreg_samples(placement, *inputs))
    assert float(aux["sigreg"]) == pytest.approx(expected, rel=1e-5)
    assert float(value) == pytest.approx(0.5 + 0.25 * expected, rel=1e-6)


def test_pooled_is_the_pooled_features_statistic_bit_for_bit():
    inputs = placement_inputs()
    pooled, key = jnp.asarray(inputs[0]), jax.random.key(4)
    expected = jnp.float32(0.5) + 0.25 * sigreg(pooled, jax.random.fold_in(key, SIGREG_STREAM), 32)
    value, _ = with_anticollapse(jnp.float32(0.5), pooled, config(), key, *sigreg_samples("pooled", *inputs))
    assert np.asarray(value).tobytes() == np.asarray(expected).tobytes()


TINY = dict(model="tiny", width=32, depth=1, heads=2, patch_size=4, image_size=16, pred_depth=1, pred_width=16,
            total_updates=100)


def hand_masks(key, b):
    """One context of 6 slots (the last 2 padding), one target set of 3 slots (the last padding), 4x4 grid."""
    tile = lambda x: jnp.broadcast_to(x, (b, *x.shape))
    return SimpleNamespace(context_index=tile(jnp.array([[0, 1, 2, 4, 15, 15]], jnp.int32)),
                           context_valid=tile(jnp.array([[True, True, True, True, False, False]])),
                           target_index=tile(jnp.array([[9, 10, 13]], jnp.int32)),
                           target_valid=tile(jnp.array([[True, True, False]])))


@pytest.mark.parametrize("placement", ["pooled", "tokens", "predictions"])
def test_an_i_jepa_step_takes_sigreg_over_the_placement_s_features(placement):
    images = jax.random.normal(jax.random.key(1), (4, 16, 16, 3))
    key = jax.random.key(2)
    objective = IJEPAObjective(IJEPAConfig(**TINY, sigreg_weight=0.25, sigreg_slices=32, sigreg_on=placement))
    objective.sample_masks = hand_masks
    params = objective.init(jax.random.key(0))
    _, aux = jax.jit(lambda p: objective.loss(p, p["encoder"], {"image": images}, key, jnp.int32(0)))(params)
    # the features computed here, the valid slots selected by hand
    m = hand_masks(None, 4)
    z_ctx = objective._encoder.merge(params["encoder"])(images, m.context_index, m.context_valid)  # [B, 1, 6, D]
    z = objective._predictor.merge(params["predictor"])(z_ctx, m.context_index, m.context_valid, m.target_index,
                                                         m.target_valid)  # [B, 1, 3, D]
    z_ctx, z = np.asarray(z_ctx, np.float32), np.asarray(z, np.float32)
    rows = {"pooled": z_ctx[:, 0, :4].mean(axis=1),
            "tokens": z_ctx[:, 0, :4].reshape(-1, z_ctx.shape[-1]),
            "predictions": z[:, 0, :2].reshape(-1, z.shape[-1])}[placement]
    expected = float(sigreg(rows, jax.random.fold_in(key, SIGREG_STREAM), 32))
    assert float(aux["sigreg"]) == pytest.approx(expected, rel=1e-4)
