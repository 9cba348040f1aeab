"""This project against the official I-JEPA code's own outputs (tests/data/golden/README.md).

The official weights are loaded into our modules through `models.convert.from_official`, then the
forward pass, the loss, every gradient, the schedules, AdamW and the mask collator's statistics are
compared with what facebookresearch/ijepa computed.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jepa_cli import masks
from jepa_cli.models.convert import from_official
from jepa_cli.models.vit import gather_tokens
from jepa_cli.objectives.ijepa import IJEPAConfig, IJEPAObjective, ema_momentum, layer_norm_no_affine, masked_token_loss
from jepa_cli.training import config as config_lib
from jepa_cli.training import optimizer, schedules

pytestmark = pytest.mark.slow

GOLDEN = Path(__file__).parent / "data" / "golden"


def _group(data, prefix: str) -> dict[str, np.ndarray]:
    return {k[len(prefix) + 1:]: data[k] for k in data.files if k.startswith(prefix + "/")}


@pytest.fixture(scope="module")
def official():
    """The official pass: our objective with the official weights, and the official arrays."""
    data = np.load(GOLDEN / "ijepa_forward_backward.npz")
    # VisionTransformer(img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=4) and a predictor 32 x 2
    objective = IJEPAObjective(IJEPAConfig(image_size=32, patch_size=4, channels=3, width=64, depth=2, heads=4,
                                           pred_width=32, pred_depth=2, pred_heads=4))
    params = {"encoder": from_official(_group(data, "enc")),
              "predictor": from_official(_group(data, "pred"), predictor=True)}
    target = from_official(_group(data, "tgt"))
    images = jnp.asarray(data["imgs"].transpose(0, 2, 3, 1))  # NCHW -> NHWC
    context = jnp.asarray(data["ctx"])[:, None]  # [B, 1, K]: one context
    targets = jnp.asarray(data["targets"])  # [B, M, T]
    everything = lambda index: jnp.ones(index.shape, bool)  # noqa: E731 - the official lists have no padding

    def loss(params):
        h = gather_tokens(layer_norm_no_affine(objective.encoder(target)(images)), targets)
        z_ctx = objective.encoder(params["encoder"])(images, context, everything(context))
        z = objective.predictor(params["predictor"])(z_ctx, context, everything(context), targets, everything(targets))
        return masked_token_loss(z, h, everything(targets), "smooth_l1"), (z_ctx, z)

    (value, (z_ctx, z)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)  # one compile, not op by op
    return {"data": data, "objective": objective, "params": params, "target": target, "images": images,
            "loss": value, "z_ctx": z_ctx, "z": z, "grads": grads}


def test_official_weights_load_into_our_modules_with_the_same_shapes(official):
    shapes = official["objective"].param_shapes()
    ours = jax.tree.map(lambda a: a.shape, official["params"])
    assert ours == jax.tree.map(lambda s: s.shape, shapes)


def test_our_fixed_position_tables_equal_the_official_ones(official):
    from jepa_cli.models import sincos_2d

    np.testing.assert_allclose(sincos_2d(64, (8, 8)), official["data"]["enc/pos_embed"][0], atol=1e-6)
    np.testing.assert_allclose(sincos_2d(32, (8, 8)), official["data"]["pred/predictor_pos_embed"][0], atol=1e-6)


def test_target_encoder_features_equal_the_official_ones(official):
    h_full = official["objective"].encoder(official["target"])(official["images"])  # [3, 64, 64]
    np.testing.assert_allclose(np.asarray(h_full), official["data"]["h_full"], atol=1e-5)


def test_context_encoder_on_the_context_equals_the_official_one(official):
    np.testing.assert_allclose(np.asarray(official["z_ctx"][:, 0]), official["data"]["z_ctx"], atol=1e-5)


def test_predictions_equal_the_official_ones(official):
    # ours [B, M, T, D]; official [M * B, T, D], row m * B + b (repeat_interleave_batch)
    z = np.asarray(official["z"]).transpose(1, 0, 2, 3).reshape(12, 6, 64)
    np.testing.assert_allclose(z, official["data"]["z"], atol=1e-5)


def test_loss_equals_the_official_smooth_l1(official):
    assert float(official["loss"]) == pytest.approx(float(official["data"]["loss"]), rel=1e-6)  # 0.46146548


def test_every_gradient_equals_the_official_one(official):
    data = official["data"]
    want = {"encoder": from_official(_group(data, "grad_enc")),
            "predictor": from_official(_group(data, "grad_pred"), predictor=True)}
    worst = jax.tree.map(lambda g, w: float(np.abs(np.asarray(g) - w).max() / np.abs(w).max()), official["grads"], want)
    assert max(jax.tree.leaves(worst)) < 1e-5  # measured 3.4e-7: float32 rounding


@pytest.fixture(scope="module")
def official_schedules():
    return np.load(GOLDEN / "ijepa_schedules_adamw.npz")


def _steps(name: str, data) -> tuple[np.ndarray, dict]:
    """The update indices and the trainer's lengths (training/config.py resolve_lengths, the path every
    run takes) of run `a` (ipe 7, 10 epochs, warmup 2, ipe_scale 1.25) or `b` (in1k_vith14: ipe 625,
    300 epochs, warmup 40)."""
    steps = np.arange(len(data["a_lr"])) if name == "a" else data["b_index"]
    ipe, epochs, warmup, ipe_scale = (7, 10, 2, 1.25) if name == "a" else (625, 300, 40, 1.0)
    cfg = config_lib.build_config({"batch_size": 16, "epochs": epochs, "warmup_epochs": warmup, "ipe_scale": ipe_scale})
    return steps, config_lib.resolve_lengths(cfg, num_samples=16 * ipe)


def test_the_trainers_lengths_are_the_official_ones(official_schedules):
    _, lengths = _steps("a", official_schedules)
    # official: T_max = int(ipe_scale * num_epochs * ipe), warmup = warmup_epochs * ipe, the EMA ramp unrounded
    assert (lengths["steps"], lengths["t_max"], lengths["warmup_steps"], lengths["ema_t_max"]) == (70, 87, 14, 87.5)


@pytest.mark.parametrize("run", ["a", "b"])
def test_lr_schedule_equals_the_official_sequence(official_schedules, run):
    steps, lengths = _steps(run, official_schedules)
    lr = jax.jit(schedules.warmup_cosine(2e-4, 1e-3, 1e-6, lengths["warmup_steps"], lengths["t_max"]))
    np.testing.assert_allclose(np.asarray(lr(jnp.asarray(steps))), official_schedules[f"{run}_lr"], rtol=2e-5)


@pytest.mark.parametrize("run", ["a", "b"])
def test_weight_decay_schedule_equals_the_official_sequence(official_schedules, run):
    steps, lengths = _steps(run, official_schedules)
    wd = jax.jit(schedules.cosine_wd(0.04, 0.4, lengths["t_max"]))
    np.testing.assert_allclose(np.asarray(wd(jnp.asarray(steps))), official_schedules[f"{run}_wd"], rtol=2e-5)


@pytest.mark.parametrize("run", ["a", "b"])
def test_ema_momentum_equals_the_official_generator(official_schedules, run):
    steps, lengths = _steps(run, official_schedules)
    m = jax.jit(lambda t: ema_momentum(t, 0.996, 1.0, lengths["ema_t_max"]))(jnp.asarray(steps))
    np.testing.assert_allclose(np.asarray(m), official_schedules[f"{run}_m"], rtol=0, atol=1e-7)


def test_three_adamw_steps_equal_torch_adamw(official_schedules):
    data = official_schedules
    params = {"w": jnp.asarray(data["w0"]), "b": jnp.asarray(data["b0"])}
    tx = optimizer.make_optimizer(lambda count: 1e-2 * (count + 1), lambda count: 0.1 * (count + 1),
                                  {"w": True, "b": False})
    state = tx.init(params)
    for s in range(3):
        updates, state = tx.update({"w": jnp.asarray(data["gw"][s]), "b": jnp.asarray(data["gb"][s])}, state, params)
        params = jax.tree.map(lambda p, u: p + u, params, updates)
    np.testing.assert_allclose(np.asarray(params["w"]), data["w3"], atol=1e-6)
    np.testing.assert_allclose(np.asarray(params["b"]), data["b3"], atol=1e-6)


# -- the mask collator ---------------------------------------------------------------------------

def _ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic sup |F_a - F_b|."""
    grid = np.union1d(a, b)
    fa = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    fb = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.abs(fa - fb).max())


def _ks_critical(n: int, m: int, alpha: float = 0.001) -> float:
    """The two-sample KS rejection threshold at level alpha (asymptotic)."""
    return float(np.sqrt(-0.5 * np.log(alpha / 2)) * np.sqrt((n + m) / (n * m)))


OFFICIAL_MASKS = dict(official_positions=True, npred=4, pred_scale=(0.15, 0.2), enc_scale=(0.85, 1.0),
                      aspect=(0.75, 1.5), min_keep=10, allow_overlap=False)  # in1k_vith14_ep300.yaml


@pytest.fixture(scope="module")
def collator():
    return np.load(GOLDEN / "ijepa_collator_stats.npz")


@pytest.mark.parametrize("grid", [16, 14])
def test_context_sizes_before_the_cut_follow_the_official_distribution(collator, grid):
    # the official protocol: 64 collator calls of 128; block sizes are shared within a call, so the
    # KS threshold counts calls (64), not contexts
    config = masks.config_from_options("multiblock", grid=(grid, grid), context_size=grid * grid, **OFFICIAL_MASKS)
    ours = np.asarray(masks.sample_many(jax.random.PRNGKey(1), config, 128, 64).context_valid.sum(-1)).ravel()
    official = collator[f"g{grid}_B128_ctx"].astype(np.int64)  # 8192 contexts: mean 110.1 (16x16), 81.8 (14x14)
    assert abs(ours.mean() - official.mean()) < 2.0  # measured 110.5 and 82.4
    assert _ks_statistic(ours, official) < _ks_critical(64, 64)  # measured 0.010 and 0.021


def test_official_truncation_cuts_per_gpu_batch_as_the_official_collator(collator):
    # in1k_vith14: global batch 2048 = 16 GPUs x 128; each GPU's collator draws its own block sizes
    # and cuts to the minimum over its 128
    config = masks.config_from_options("multiblock", grid=(16, 16), official_truncation=True, collator_batch=128,
                                       **OFFICIAL_MASKS)
    valid = np.concatenate([np.asarray(masks.sample(jax.random.PRNGKey(s), config, 2048).context_valid)
                            for s in range(4)])  # [8192, 1, K]
    counts = valid.sum(-1).reshape(-1, 128)  # one row per GPU batch
    cut = counts.min(axis=1)
    assert np.all(counts == cut[:, None])  # every context of a GPU batch is cut to that batch's minimum
    official = collator["g16_B128_cut"].astype(np.int64)  # 64 GPU batches: mean 68.48
    assert abs(cut.mean() - official.mean()) < 4.0
    assert _ks_statistic(cut, official) < _ks_critical(len(cut), len(official))


def test_official_truncation_over_the_whole_batch_is_the_shorter_global_minimum(collator):
    # without collator_batch the cut runs over the whole batch: at 2048 that is the official
    # single-collator figure (6 batches: 53-85, mean 60.5), well below the per-GPU cut (68.5)
    config = masks.config_from_options("multiblock", grid=(16, 16), official_truncation=True, **OFFICIAL_MASKS)
    cuts = np.asarray(masks.sample_many(jax.random.PRNGKey(0), config, 2048, 8).context_valid.sum(-1)).min(axis=(1, 2))
    official = collator["g16_B2048_cut"].astype(np.int64)
    assert official.min() - 12 <= cuts.min() and cuts.max() <= official.max()
    assert abs(np.median(cuts) - np.median(official)) < 8.0
    assert np.mean(cuts) < collator["g16_B128_cut"].mean() - 5


def test_official_flags_cover_the_grid_as_the_official_collator(collator):
    # the official collator's output (cut lists) covers the top-left far more than the bottom-right
    config = masks.config_from_options("multiblock", grid=(16, 16), official_truncation=True, **OFFICIAL_MASKS)
    maskset = masks.sample_many(jax.random.PRNGKey(3), config, 128, 64)  # the official protocol: 64 x 128
    flat = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), maskset)
    context, _ = masks.to_dense(flat, 256)
    cover = np.asarray(context)[:, 0].mean(axis=0)  # fraction of contexts holding each patch
    np.testing.assert_allclose(cover, collator["g16_cover"], atol=0.06)
    assert cover.reshape(16, 16)[-1].max() == 0 and cover.reshape(16, 16)[:, -1].max() == 0  # ijepa issue #60
