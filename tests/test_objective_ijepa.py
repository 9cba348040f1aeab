"""The I-JEPA objective behind the Objective seam (tiny configurations only)."""

import re
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jepa_cli.data import transforms
from jepa_cli.errors import InputError
from jepa_cli.objectives import EMASpec, IJEPAConfig, IJEPAObjective, Objective, make_objective
from jepa_cli.objectives.ijepa import layer_norm_no_affine, masked_token_loss
from jepa_cli.objectives.telemetry import (covariance_penalty, effective_rank, repr_cov_offdiag, repr_std,
                                          variance_hinge)

# 32x32 images, patch 4 -> an 8x8 grid (room for the official multiblock masks)
TINY = dict(model="tiny", width=32, depth=2, heads=2, patch_size=4, image_size=32,
            pred_depth=2, pred_width=16, total_updates=100)


def hand_masks(key, b):
    """C=1 context of 10 slots (2 padded, junk index 63), M=2 target sets of 3 slots (1 padded)."""
    ci = jnp.array([0, 1, 2, 3, 8, 9, 10, 11, 63, 63], jnp.int32)
    cv = jnp.arange(10) < 8
    ti = jnp.array([[36, 37, 0], [50, 51, 52]], jnp.int32)
    tv = jnp.array([[True, True, False], [True, True, True]])
    tile = lambda x: jnp.broadcast_to(x, (b, *x.shape))
    return SimpleNamespace(context_index=tile(ci)[:, None], context_valid=tile(cv)[:, None],
                           target_index=tile(ti), target_valid=tile(tv))


@pytest.fixture(scope="module")
def setup():
    obj = IJEPAObjective(IJEPAConfig(**TINY))
    # hand-built masks: the real sampler is tested with jepa_cli.masks (and costs a compile)
    obj.sample_masks = hand_masks
    params = obj.init(jax.random.key(0))
    images = jax.random.normal(jax.random.key(1), (4, 32, 32, 3))
    return obj, params, images


@pytest.fixture(scope="module")
def grad_fn(setup):
    """One compiled (loss, aux), (d/dparams, d/dema) shared by the tests below."""
    obj, _, images = setup
    return jax.jit(jax.value_and_grad(
        lambda p, e: obj.loss(p, e, {"image": images}, jax.random.key(2), jnp.int32(3)),
        argnums=(0, 1), has_aux=True))


@pytest.mark.slow
def test_is_an_objective_with_pure_dict_params(setup):
    obj, params, _ = setup
    assert isinstance(obj, Objective)
    assert set(params) == {"encoder", "predictor"}
    assert all(isinstance(k, str) for k in params["encoder"]["blocks"])
    assert isinstance(params["predictor"]["mask_token"], jax.Array)
    assert obj.ema_spec.source == "encoder" and isinstance(obj.ema_spec, EMASpec)


@pytest.mark.slow
def test_loss_finite_gradient_reaches_encoder_and_predictor_not_ema(setup, grad_fn):
    obj, params, images = setup
    (value, aux), (g, g_ema) = grad_fn(params, params["encoder"])
    assert np.isfinite(float(value)) and float(value) > 0
    assert float(aux["loss"]) == float(value)
    for part in ("encoder", "predictor"):
        norms = [float(jnp.linalg.norm(x)) for x in jax.tree.leaves(g[part])]
        assert all(n > 0 for n in norms), part
    assert all(float(jnp.abs(x).max()) == 0.0 for x in jax.tree.leaves(g_ema))
    assert float(aux["context_tokens"]) == 8.0 and float(aux["target_tokens"]) == 5.0
    assert float(aux["repr_std"]) > 0 and np.isfinite(float(aux["repr_cov_offdiag"]))


@pytest.mark.slow
def test_loss_equals_its_definition_on_hand_masks(setup, grad_fn):
    obj, params, images = setup
    ema = jax.tree.map(lambda x: x * 1.1, params["encoder"])  # the target comes from the EMA
    (value, aux), _ = grad_fn(params, ema)
    m = hand_masks(None, 4)

    @jax.jit
    def reference(p, e):
        enc, tgt, pred = obj.encoder(p["encoder"]), obj.encoder(e), obj.predictor(p["predictor"])
        h = layer_norm_no_affine(tgt(images))
        ctx = enc(images, m.context_index[:, 0, :8])  # only the 8 valid context tokens, unpadded
        return h, ctx, pred(ctx, m.context_index[:, 0, :8], None, m.target_index, None)

    h, ctx, z = map(np.asarray, reference(params, ema))
    d = np.abs(z - np.take_along_axis(h[:, None], np.asarray(m.target_index)[..., None], axis=2))
    sl1 = np.where(d < 1, 0.5 * d * d, d - 0.5).mean(-1)  # [B, M, T]
    expected = (sl1[:, 0, :2].sum() + sl1[:, 1].sum()) / (4 * 5)
    np.testing.assert_allclose(float(value), expected, rtol=1e-5)
    assert float(aux["context_tokens"]) == 8.0 and float(aux["target_tokens"]) == 5.0
    pooled = np.asarray(ctx).mean(axis=1)
    np.testing.assert_allclose(float(aux["repr_std"]), pooled.std(axis=0).mean(), rtol=1e-4)


def test_smooth_l1_l2_l1_on_a_hand_built_case():
    pred = jnp.array([[[0.0, 0.0], [0.0, 0.0], [5.0, 5.0]]])
    target = jnp.array([[[0.5, -2.0], [1.0, 3.0], [0.0, 0.0]]])
    valid = jnp.array([[True, True, False]])  # the third token is padding
    # smooth-l1: token0 (0.125 + 1.5) / 2 = 0.8125, token1 (0.5 + 2.5) / 2 = 1.5
    assert float(masked_token_loss(pred, target, valid, "smooth_l1")) == pytest.approx(1.15625)
    assert float(masked_token_loss(pred, target, valid, "l2")) == pytest.approx((2.125 + 5.0) / 2)
    assert float(masked_token_loss(pred, target, valid, "l1")) == pytest.approx((1.25 + 2.0) / 2)


def test_ema_momentum_follows_the_linear_ramp():
    mom = IJEPAObjective(IJEPAConfig(**{**TINY, "total_updates": 200})).ema_spec.momentum
    for step, want in [(0, 0.996), (50, 0.997), (100, 0.998), (200, 1.0), (300, 1.0)]:
        assert float(mom(step)) == pytest.approx(want, abs=1e-7)  # ema0 + i (ema1 - ema0) / T
    assert float(jax.jit(mom)(jnp.int32(150))) == pytest.approx(0.999, abs=1e-7)
    custom = IJEPAObjective(IJEPAConfig(**{**TINY, "ema": (0.99, 0.999), "total_updates": 10}))
    assert float(custom.ema_spec.momentum(4)) == pytest.approx(0.99 + 4 * 0.009 / 10, abs=1e-7)


def test_telemetry_constant_is_zero_and_hand_values():
    const = jnp.ones((8, 5)) * 3.0
    assert float(repr_std(const)) == 0.0 and float(repr_cov_offdiag(const)) == 0.0
    z = jnp.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 2.0], [0.0, -2.0]])
    assert float(repr_std(z)) == pytest.approx((np.sqrt(0.5) + np.sqrt(2.0)) / 2)
    assert float(repr_cov_offdiag(z)) == pytest.approx(0.0, abs=1e-7)  # uncorrelated features
    corr = jnp.array([[1.0, 1.0], [-1.0, -1.0]])  # C = [[2, 2], [2, 2]]
    assert float(repr_cov_offdiag(corr)) == pytest.approx(2.0)


def test_variance_hinge_and_covariance_penalty_hand_values():
    # column 0: var (ddof 1) 2, std sqrt(2.0001) > 1 -> 0; column 1: constant, std 0.01 -> 0.99
    z = jnp.array([[0.0, 5.0], [2.0, 5.0]])
    assert float(variance_hinge(z)) == pytest.approx(0.99 / 2, rel=1e-6)
    assert float(variance_hinge(z, target=2.0)) == pytest.approx((2.0 - np.sqrt(2.0001) + 1.99) / 2, rel=1e-6)
    corr = jnp.array([[1.0, 1.0], [-1.0, -1.0]])  # C = [[2, 2], [2, 2]]: (2^2 + 2^2) / D = 4
    assert float(covariance_penalty(corr)) == pytest.approx(4.0)


@pytest.mark.slow
def test_official_loss_has_no_regulariser_terms(setup, grad_fn):
    _, params, _ = setup
    (_, aux), _ = grad_fn(params, params["encoder"])
    assert not {"var_loss", "cov_loss", "pred_loss"} & set(aux)


@pytest.mark.slow
def test_var_and_cov_weights_add_their_terms_to_the_prediction_loss(setup, grad_fn):
    obj, params, images = setup
    (official, _), _ = grad_fn(params, params["encoder"])
    reg = IJEPAObjective(IJEPAConfig(**TINY, var_weight=0.5, cov_weight=0.25, var_target=2.0))
    reg.sample_masks = hand_masks
    value, aux = jax.jit(lambda p: reg.loss(p, p["encoder"], {"image": images}, jax.random.key(2),
                                            jnp.int32(3)))(params)
    assert float(aux["pred_loss"]) == pytest.approx(float(official), rel=1e-6)
    assert float(aux["var_loss"]) > 1.0  # pooled features of a random encoder: std far below 2
    expected = float(official) + 0.5 * float(aux["var_loss"]) + 0.25 * float(aux["cov_loss"])
    assert float(value) == pytest.approx(expected, rel=1e-6) and float(aux["loss"]) == float(value)


@pytest.mark.parametrize("value, message", [(-1.0, "{} must be >= 0, got -1.0"),
                                            (float("inf"), "ijepa option {} must be a number, got inf"),
                                            (float("nan"), "ijepa option {} must be a number, got nan")])
@pytest.mark.parametrize("name", ["var_weight", "cov_weight", "var_target"])
def test_negative_or_non_finite_regulariser_option_is_refused_with_its_name(name, value, message):
    with pytest.raises(InputError, match=re.escape(message.format(name))):
        IJEPAConfig(**TINY, **{name: value})


@pytest.mark.slow
def test_collapsed_encoder_gives_zero_repr_std_and_target_std_and_rank_one(setup, grad_fn):
    obj, params, images = setup
    dead = {**params, "encoder": jax.tree.map(jnp.zeros_like, params["encoder"])}
    (_, aux), _ = grad_fn(dead, dead["encoder"])
    assert float(aux["repr_std"]) == 0.0 and float(aux["repr_cov_offdiag"]) == 0.0
    assert float(aux["target_std"]) == 0.0 and float(aux["effective_rank"]) == 1.0


def test_effective_rank_counts_the_dimensions_the_batch_spans():
    rng = np.random.default_rng(0)
    isotropic = rng.normal(size=(4000, 8))
    assert float(effective_rank(isotropic)) == pytest.approx(8.0, abs=0.05)
    line = rng.normal(size=(64, 1)) * rng.normal(size=(1, 8))  # rank one: every row on one line
    assert float(effective_rank(line)) == pytest.approx(1.0, abs=1e-4)
    two_equal = np.concatenate([rng.normal(size=(4000, 2)), np.zeros((4000, 6))], axis=1)
    assert float(effective_rank(two_equal)) == pytest.approx(2.0, abs=0.01)
    assert float(effective_rank(np.ones((16, 8)))) == 1.0  # constant: no variance at all


@pytest.mark.slow
def test_weight_decay_mask_excludes_biases_and_1d_includes_mask_token(setup):
    obj, params, _ = setup
    mask = obj.weight_decay_mask(params)
    assert mask["predictor"]["mask_token"] is True
    assert mask["encoder"]["blocks"]["0"]["attn"]["qkv"]["kernel"] is True
    assert mask["encoder"]["patch_embed"]["kernel"] is True
    assert mask["encoder"]["patch_embed"]["bias"] is False
    assert mask["encoder"]["blocks"]["1"]["norm1"]["scale"] is False
    assert mask["predictor"]["proj"]["bias"] is False
    flat = jax.tree_util.tree_leaves_with_path(params)
    decayed = {jax.tree_util.keystr(p) for p, x in flat if x.ndim > 1}
    got = {jax.tree_util.keystr(p) for p, v in jax.tree_util.tree_leaves_with_path(mask) if v}
    assert got == decayed
    # works on abstract params too (the trainer builds the optimizer from eval_shape)
    abstract = jax.eval_shape(obj.init, jax.ShapeDtypeStruct((2,), np.uint32))
    assert obj.weight_decay_mask(abstract) == mask


@pytest.mark.slow
def test_encode_shapes(setup):
    obj, params, images = setup
    out = jax.jit(obj.encode, static_argnames="last_layers")(params["encoder"], images, last_layers=2)
    assert out.shape == (4, 64, 64) and out.dtype == jnp.float32


def test_make_objective_registry_and_unknown_keys():
    obj = make_objective("ijepa", {**TINY, "loss": "l2", "npred": 2, "ema": [0.99, 1.0]})
    assert obj.config.loss == "l2" and obj.config.ema == (0.99, 1.0)
    assert obj.config.mask_config.npred == 2 and obj.config.mask_config.grid == (8, 8)
    again = make_objective("ijepa", obj.to_config())
    assert again.config == obj.config
    with pytest.raises(InputError, match="'lossy'"):
        make_objective("ijepa", {"lossy": "l2"})
    with pytest.raises(InputError, match="unknown objective 'vjepa9'"):
        make_objective("vjepa9", {})
    with pytest.raises(InputError, match="unknown loss"):
        make_objective("ijepa", {"loss": "huber"})


# -- transforms ------------------------------------------------------------------------------------
def test_train_transform_normalises_and_is_seeded():
    t = IJEPAObjective(IJEPAConfig(**TINY)).train_transform(16)
    flat = {"image": np.full((24, 20, 3), 128, np.uint8), "label": 7}
    out = t(flat, np.random.default_rng(0))
    assert out["image"].shape == (16, 16, 3) and out["image"].dtype == np.float32 and out["label"] == 7
    want = (128 / 255 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    np.testing.assert_allclose(out["image"][5, 7], want, rtol=1e-5)
    ramp = {"image": np.tile(np.arange(0, 240, 10, dtype=np.uint8)[None, :, None], (24, 1, 3))}
    a, b = t(ramp, np.random.default_rng(1)), t(ramp, np.random.default_rng(1))
    np.testing.assert_array_equal(a["image"], b["image"])
    assert np.abs(a["image"] - t(ramp, np.random.default_rng(2))["image"]).max() > 0.01


def test_random_resized_crop_box_respects_scale_and_aspect():
    rng = np.random.default_rng(0)
    for _ in range(300):
        top, left, h, w = transforms.random_resized_crop_box(64, 64, rng, (0.3, 1.0), (3 / 4, 4 / 3))
        assert 0 <= top and top + h <= 64 and 0 <= left and left + w <= 64
        assert 0.3 * 4096 * 0.9 <= h * w <= 4096
        assert 3 / 4 * 0.9 <= w / h <= 4 / 3 * 1.1


def test_eval_transform_center_crops_grayscale():
    t = transforms.resize_center_crop(8, mean=(0.5,), std=(0.5,), resize_ratio=1.0)
    img = np.zeros((8, 12, 1), np.uint8)
    img[:, 2:10] = 255  # the centre 8 columns are white, 2 black columns each side
    out = t({"image": img})["image"]
    assert out.shape == (8, 8, 1)
    np.testing.assert_allclose(out, 1.0)


@pytest.mark.parametrize("option, value, message", [
    ("depth", "two", "ijepa option depth must be an integer, got 'two'"),
    ("patch_size", 2.5, "ijepa option patch_size must be an integer, got 2.5"),
    ("ema", [0.996, "one"], "ijepa option ema must be a list of 2 values (a number, a number), got (0.996, 'one')"),
    ("mean", "gray", "ijepa option mean must be a list of numbers, got 'gray'"),
    ("async", True, "unknown ijepa option 'async'"),
])
def test_an_option_of_the_wrong_type_is_named_before_the_model_is_built(option, value, message):
    from jepa_cli.errors import InputError
    from jepa_cli.objectives import make_objective

    with pytest.raises(InputError) as caught:
        make_objective("ijepa", {"image_size": 16, "patch_size": 2, "channels": 1, option: value})
    assert str(caught.value) == message
