"""SIGReg (jepa_cli.objectives.sigreg): the reference's own statistic (golden file made by
scripts/make_sigreg_golden.py from rbalestr-lab/lejepa), its closed form, its behaviour on normal,
collapsed and scaled batches and on a sharded batch, and the sigreg_* options of the JEPA objectives."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jepa_cli.errors import InputError
from jepa_cli.objectives import IJEPAConfig, IJEPAObjective, make_objective
from jepa_cli.objectives.audio_jepa_config import AudioJEPAConfig
from jepa_cli.objectives.sigreg import (NUM_KNOTS, NUM_SLICES, T_MAX, epps_pulley_sliced, quadrature,
                                        random_directions, sigreg)
from jepa_cli.objectives.telemetry import SIGREG_STREAM
from jepa_cli.objectives.vjepa import VJEPAConfig

GOLDEN = Path(__file__).parent / "data" / "golden" / "sigreg_lejepa.npz"
CASES = ("normal", "scaled", "skewed", "shifted_wide", "collapsed")
OPTIONS = ("sigreg_weight", "sigreg_slices", "sigreg_knots", "sigreg_t_max")


@pytest.fixture(scope="module")
def golden():
    with np.load(GOLDEN) as f:
        return {k: f[k] for k in f.files}


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_the_statistic_is_the_reference_s_on_the_same_directions(golden, name):
    got = epps_pulley_sliced(golden[f"{name}/embeddings"], golden[f"{name}/directions"],
                             int(golden[f"{name}/knots"]), float(golden[f"{name}/t_max"]))
    assert float(got) == pytest.approx(float(golden[f"{name}/statistic"]), rel=2e-6, abs=1e-6)


def test_the_quadrature_is_the_trapezoid_rule_doubled_times_the_gaussian_window():
    t, window, weights = quadrature(5, 2.0)  # knots 0, 0.5, 1, 1.5, 2; dt 0.5
    np.testing.assert_allclose(t, [0.0, 0.5, 1.0, 1.5, 2.0])
    np.testing.assert_allclose(window, np.exp(-np.array([0.0, 0.125, 0.5, 1.125, 2.0])), rtol=1e-6)
    np.testing.assert_allclose(weights, np.array([0.5, 1.0, 1.0, 1.0, 0.5]) * np.asarray(window), rtol=1e-6)


def test_a_batch_at_zero_gives_n_times_the_closed_form_integral():
    # every x_n = 0: ecf = 1, so the statistic is N x the integral of (1 - g)^2 g over the line,
    # g = exp(-t^2/2): sqrt(2 pi) - 2 sqrt(pi) + sqrt(2 pi / 3); fine knots far out reach it
    closed_form = math.sqrt(2 * math.pi) - 2 * math.sqrt(math.pi) + math.sqrt(2 * math.pi / 3)
    got = epps_pulley_sliced(jnp.zeros((10, 3)), jnp.eye(3), num_knots=4001, t_max=12.0)
    assert float(got) == pytest.approx(10 * closed_form, rel=1e-4)


def test_a_standard_normal_batch_scores_low_and_a_collapsed_or_scaled_one_high():
    # a normal batch: N |ecf - g|^2 has mean 1 - g^2 at each t, so the statistic stays of order 1
    # whatever N; a collapsed or mis-scaled batch grows with N
    z = jax.random.normal(jax.random.key(0), (1024, 32))
    key = jax.random.key(1)
    normal = float(sigreg(z, key))
    assert normal < 2.0
    assert float(sigreg(jnp.full((1024, 32), 0.3), key)) > 100 * normal
    assert float(sigreg(4.0 * z, key)) > 100 * normal
    assert float(sigreg(0.25 * z, key)) > 50 * normal


def test_the_directions_are_unit_columns_drawn_from_the_key():
    a = random_directions(jax.random.key(0), 7, 5)
    assert a.shape == (7, 5)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(a), axis=0), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(a, random_directions(jax.random.key(0), 7, 5))
    assert not np.allclose(a, random_directions(jax.random.key(1), 7, 5))


def test_the_keyed_statistic_uses_the_key_s_directions():
    z = jax.random.normal(jax.random.key(0), (16, 6)) * 1.5
    key = jax.random.key(3)
    expected = epps_pulley_sliced(z, random_directions(key, 6, 8), 9, 2.5)
    assert float(sigreg(z, key, 8, 9, 2.5)) == float(expected)
    assert float(sigreg(z, jax.random.key(4), 8, 9, 2.5)) != float(expected)  # a new update, new slices


def test_on_a_batch_sharded_over_8_devices_it_is_the_global_batch_s_statistic():
    assert jax.device_count() == 8
    z = jax.random.normal(jax.random.key(0), (64, 16)) * 1.3 + 0.2
    key = jax.random.key(5)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharded = jax.device_put(z, NamedSharding(mesh, P("data")))
    assert len(sharded.addressable_shards) == 8 and sharded.addressable_shards[0].data.shape == (8, 16)
    f = jax.jit(lambda x, k: sigreg(x, k, 32))
    assert float(f(sharded, key)) == pytest.approx(float(sigreg(z, key, 32)), rel=1e-6)


def test_the_gradient_reaches_the_embeddings():
    z = jnp.zeros((8, 4)).at[:, 0].set(jnp.arange(8.0))
    g = jax.grad(lambda x: sigreg(x, jax.random.key(0), 16))(z)
    assert np.all(np.isfinite(np.asarray(g))) and float(jnp.abs(g).sum()) > 0.0


# -- the objectives' options ---------------------------------------------------------------------

def test_the_options_are_declared_once_with_i_jepa_s_help_and_the_reference_s_defaults():
    for name in OPTIONS:
        fields = [{f.name: f for f in dataclasses.fields(cls)}[name]
                  for cls in (IJEPAConfig, VJEPAConfig, AudioJEPAConfig)]
        assert fields[0].metadata == fields[1].metadata == fields[2].metadata
        assert fields[0].metadata["applies"] == ("ijepa", "vjepa", "audio-jepa", "lejepa")
        assert fields[0].default == fields[1].default == fields[2].default
    config = IJEPAConfig()
    assert config.sigreg_weight == 0.0
    assert (config.sigreg_slices, config.sigreg_knots, config.sigreg_t_max) == (NUM_SLICES, NUM_KNOTS, T_MAX)
    assert (NUM_SLICES, NUM_KNOTS, T_MAX) == (256, 17, 3.0)  # lejepa MINIMAL.md, epps_pulley.py


@pytest.mark.parametrize("key, value, message", [
    ("sigreg_weight", 1.5, r"sigreg_weight must be in \[0, 1\], got 1.5"),
    ("sigreg_weight", -0.1, r"sigreg_weight must be in \[0, 1\], got -0.1"),
    ("sigreg_slices", 0, "sigreg_slices must be >= 1, got 0"),
    ("sigreg_knots", 1, "sigreg_knots must be >= 2, got 1"),
    ("sigreg_knots", -3, "sigreg_knots must be >= 2, got -3"),
    ("sigreg_t_max", 0.0, "sigreg_t_max must be > 0, got 0.0"),
    ("sigreg_t_max", -1.0, "sigreg_t_max must be > 0, got -1.0"),
])
@pytest.mark.parametrize("name", ["ijepa", "vjepa", "audio-jepa"])
def test_a_value_out_of_bounds_is_refused_in_one_line(name, key, value, message):
    with pytest.raises(InputError, match=message) as info:
        make_objective(name, {key: value})
    assert "\n" not in str(info.value)


TINY = dict(model="tiny", width=32, depth=1, heads=2, patch_size=4, image_size=16, pred_depth=1, pred_width=16,
            total_updates=100)


def hand_masks(key, b):
    """One context of 6 slots (the last 2 padding), one target set of 3 slots, on a 4x4 grid."""
    tile = lambda x: jnp.broadcast_to(x, (b, *x.shape))
    return SimpleNamespace(context_index=tile(jnp.array([[0, 1, 2, 4, 15, 15]], jnp.int32)),
                           context_valid=tile(jnp.array([[True, True, True, True, False, False]])),
                           target_index=tile(jnp.array([[9, 10, 13]], jnp.int32)),
                           target_valid=tile(jnp.ones((1, 3), bool)))


def test_an_i_jepa_step_adds_weight_times_sigreg_of_the_pooled_context_features():
    images = jax.random.normal(jax.random.key(1), (8, 16, 16, 3))
    key = jax.random.key(2)

    def loss(**options):
        objective = IJEPAObjective(IJEPAConfig(**TINY, **options))
        objective.sample_masks = hand_masks
        params = objective.init(jax.random.key(0))
        step = jax.jit(lambda p: objective.loss(p, p["encoder"], {"image": images}, key, jnp.int32(0)))
        return objective, params, step(params)

    _, _, (official, official_aux) = loss()
    assert "sigreg" not in official_aux
    objective, params, (value, aux) = loss(sigreg_weight=0.25, sigreg_slices=64)
    # the same statistic on features computed here: the context encoder's 4 valid tokens, averaged
    m = hand_masks(None, 8)
    z_ctx = objective._encoder.merge(params["encoder"])(images, m.context_index, m.context_valid)  # [B, 1, 6, D]
    pooled = np.asarray(z_ctx, np.float32)[:, 0, :4].mean(axis=1)  # [B, D]
    directions = random_directions(jax.random.fold_in(key, SIGREG_STREAM), pooled.shape[1], 64)
    expected = float(epps_pulley_sliced(pooled, directions))
    assert expected > 1.0  # a random encoder's pooled features are far from a standard normal
    assert float(aux["sigreg"]) == pytest.approx(expected, rel=1e-5)
    assert float(aux["pred_loss"]) == float(official)
    assert float(value) == pytest.approx(float(official) + 0.25 * expected, rel=1e-6)


VIDEO = dict(model="tiny", width=24, depth=1, heads=2, patch_size=4, image_size=8, channels=1, num_frames=4,
             tubelet_size=2, pred_depth=1, pred_width=16, npred=[1, 1], pred_scale=[[0.25, 0.25], [0.5, 0.5]])
AUDIO = dict(model="tiny", width=32, depth=1, heads=2, pred_width=16, pred_depth=1, pred_heads=2, patch_size=4,
             sample_rate=8000, seconds=0.5, frames=16, mel_bins=16, fmax=4000.0)


@pytest.mark.parametrize("name, options, field, shape", [("vjepa", VIDEO, "video", (4, 4, 8, 8, 1)),
                                                          ("audio-jepa", AUDIO, "audio", (4, 4000))])
def test_video_and_audio_objectives_add_the_weighted_statistic_and_log_it(name, options, field, shape):
    objective = make_objective(name, {**options, "sigreg_weight": 0.5, "sigreg_slices": 32})
    params = objective.init(jax.random.key(0))
    batch = {field: jax.random.normal(jax.random.key(1), shape)}
    value, aux = jax.jit(lambda p: objective.loss(p, p["encoder"], batch, jax.random.key(2), jnp.int32(0)))(params)
    assert float(aux["sigreg"]) > 1.0  # a random encoder's pooled features are far from a standard normal
    assert float(value) == pytest.approx(float(aux["pred_loss"]) + 0.5 * float(aux["sigreg"]), rel=1e-6)
