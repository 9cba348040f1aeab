"""Flow matching and diffusion objectives: schedules, parameterisations, weights, the DiT, the EMA
of the whole tree, and the I-JEPA trainer path pinned bit for bit (tiny models, one compile each)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jepa_cli.errors import InputError
from jepa_cli.objectives import make_objective
from jepa_cli.objectives.diffusion import (cosine_alpha_sigma, edm_preconditioning, karras_sigmas,
                                           min_snr_weight)
from jepa_cli.objectives.flow import shift_time
from jepa_cli.objectives.generative import ema_decay

TINY = dict(width=32, depth=1, heads=2, patch_size=2, image_size=8, channels=1, num_classes=10)


@pytest.fixture(scope="module")
def flow():
    return make_objective("flow", TINY)


def test_flow_shift_is_sd3_formula():
    # SD3 (Esser et al. 2024) Sec. 5.3.2: t' = s t / (1 + (s - 1) t)
    t = np.array([0.0, 0.25, 0.5, 1.0])
    np.testing.assert_allclose(shift_time(t, 3.0), [0.0, 0.5, 0.75, 1.0])
    np.testing.assert_array_equal(shift_time(t, 1.0), t)


def test_cosine_schedule_boundaries():
    # alpha = cos(pi t / 2), sigma = sin(pi t / 2)
    a, s = cosine_alpha_sigma(jnp.array([0.0, 0.5, 1.0]))
    np.testing.assert_allclose(a, [1.0, math.sqrt(0.5), 0.0], atol=1e-7)
    np.testing.assert_allclose(s, [0.0, math.sqrt(0.5), 1.0], atol=1e-7)


def test_edm_preconditioning_matches_table_1():
    # Karras et al. 2022 Table 1 at sigma = sigma_data = 0.5 and at sigma = 2
    c_skip, c_out, c_in, c_noise = edm_preconditioning(jnp.array([0.5, 2.0]), 0.5)
    np.testing.assert_allclose(c_skip, [0.5, 0.25 / 4.25], rtol=1e-6)
    np.testing.assert_allclose(c_out, [0.5 / math.sqrt(2), 1.0 / math.sqrt(4.25)], rtol=1e-6)
    np.testing.assert_allclose(c_in, [1 / math.sqrt(0.5), 1 / math.sqrt(4.25)], rtol=1e-6)
    np.testing.assert_allclose(c_noise, [math.log(0.5) / 4, math.log(2.0) / 4], rtol=1e-6)


def test_karras_sigma_grid_runs_from_sigma_max_to_sigma_min_then_zero():
    # EDM eq. 5 with sigma_max 80, sigma_min 0.002, rho 7
    s = karras_sigmas(4)
    np.testing.assert_allclose(s[[0, 3, 4]], [80.0, 0.002, 0.0], rtol=1e-6)
    assert np.all(np.diff(s) < 0)


def test_min_snr_weights_at_known_snrs_in_each_space():
    # Hang et al. 2023: min(SNR, gamma) on the x0 loss; eps = x0 weight / SNR, v = x0 weight / (SNR + 1)
    snr = jnp.array([0.5, 5.0, 50.0])
    np.testing.assert_allclose(min_snr_weight(snr, 5.0, "x0"), [0.5, 5.0, 5.0])
    np.testing.assert_allclose(min_snr_weight(snr, 5.0, "eps"), [1.0, 1.0, 0.1], rtol=1e-6)
    np.testing.assert_allclose(min_snr_weight(snr, 5.0, "v"), [0.5 / 1.5, 5 / 6, 5 / 51], rtol=1e-6)
    np.testing.assert_allclose(min_snr_weight(snr, None, "v"), [1.0, 1.0, 1.0])


@pytest.mark.parametrize("config", [dict(prediction="eps"), dict(prediction="x0"), dict(prediction="v"),
                                    dict(schedule="edm")])
def test_each_prediction_target_maps_back_to_x0_and_eps(config):
    """The loss's target in each space, converted by to_x0_eps, gives back (x0, eps) (what samplers use)."""
    obj = make_objective("diffusion", {**TINY, **config})
    rng = np.random.default_rng(0)
    x0, eps = (jnp.asarray(rng.standard_normal((3, 8, 8, 1)), jnp.float32) for _ in range(2))
    time = jnp.array([0.2, 0.5, 0.9]) if obj.config.schedule == "cosine" else jnp.array([0.1, 1.0, 10.0])
    a, s = (v[:, None, None, None] for v in obj.alpha_sigma(time))
    x = a * x0 + s * eps
    if obj.prediction == "edm":
        c_skip, c_out, _, _ = edm_preconditioning(time, 0.5)
        raw = (x0 - c_skip[:, None, None, None] * x) / c_out[:, None, None, None]
    else:
        raw = {"eps": eps, "x0": x0, "v": a * eps - s * x0}[obj.prediction]
    got_x0, got_eps = obj.to_x0_eps(raw, x, time)
    np.testing.assert_allclose(got_x0, x0, atol=2e-5)
    np.testing.assert_allclose(got_eps, eps, atol=2e-4)


def test_edm2_power_ema_profile():
    # Karras et al. 2024 (EDM2) Sec. 3.1: beta(t) = (1 - 1/t)^(gamma + 1), t = update index + 1
    np.testing.assert_allclose(ema_decay(jnp.array([0, 1, 9]), 0.9999, 1.0), [0.0, 0.25, 0.81], rtol=1e-6)
    np.testing.assert_allclose(ema_decay(jnp.array([0, 100]), 0.9999, None), [0.9999, 0.9999])


@pytest.mark.slow
def test_untrained_dit_outputs_zero(flow):
    """adaLN-Zero: zero modulation gates and a zero final projection (Peebles & Xie 2023, Sec. 3.2)."""
    params = flow.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (2, 8, 8, 1))
    out = jax.jit(flow.network)(params, x, jnp.array([10.0, 900.0]), jnp.array([3, 10]))
    assert out.shape == (2, 8, 8, 1) and float(jnp.abs(out).max()) == 0.0
    assert params["dit"]["label_embed"]["embedding"].shape == (11, 32)  # 10 classes + the null class


@pytest.mark.slow
def test_flow_loss_is_mse_to_eps_minus_x0(flow):
    """With the untrained (zero) network the loss is mean((eps - x0)^2) for the eps drawn from the key."""
    params = flow.init(jax.random.key(0))
    x0 = jax.random.normal(jax.random.key(1), (4, 8, 8, 1))
    key = jax.random.key(2)
    loss, aux = jax.jit(flow.loss)(params, None, {"image": x0, "label": jnp.arange(4)}, key, 0)
    eps = jax.random.normal(jax.random.split(key, 3)[1], x0.shape)
    np.testing.assert_allclose(loss, jnp.mean((eps - x0) ** 2), rtol=1e-6)
    assert 0.0 < float(aux["t_mean"]) < 1.0


def test_unknown_and_misplaced_options_are_refused():
    with pytest.raises(InputError, match="unknown flow option 'schedule'"):
        make_objective("flow", {"schedule": "edm"})
    with pytest.raises(InputError, match="prediction applies to the cosine schedule"):
        make_objective("diffusion", {"schedule": "edm", "prediction": "eps"})


@pytest.mark.slow
def test_tiny_flow_model_overfits_one_batch(flow):
    """Same batch, noise and t at every step: the loss falls by more than 10x."""
    params = flow.init(jax.random.key(0))
    x0 = jax.random.uniform(jax.random.key(1), (8, 8, 8, 1), minval=-1, maxval=1)
    batch = {"image": x0, "label": jnp.arange(8)}
    tx = optax.adam(3e-3)

    @jax.jit
    def step(p, s):
        (l, _), g = jax.value_and_grad(flow.loss, has_aux=True)(p, None, batch, jax.random.key(5), 0)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s, l

    state = tx.init(params)
    params, state, first = step(params, state)
    for _ in range(100):
        params, state, last = step(params, state)
    assert float(last) < float(first) / 10, (float(first), float(last))


# Two steps of a tiny I-JEPA through init_state and the trainer's step (hand-built masks, no mask
# compile), pinned as figures rather than a hash of the bytes: XLA:CPU's float32 bits change with the
# CPU. On an AMD EPYC with AVX-512, --xla_cpu_max_isa=AVX2 moves these figures by at most 6e-11
# relative, AVX and SSE4.2 (no FMA) by up to 6e-6. The tolerance, 1e-5, sits above that and below a
# change of the trainer's maths: a warmup one update longer moves params_update_l2 by 7.5 %, a schedule
# one update longer by 5.7 %, a weight-decay end of 0.5 for 0.4 some figure by 2.1e-5.
IJEPA_PINNED = {"loss_1": 0.47401854395866394, "loss_2": 0.4626191556453705,
                "params_update_l2": 0.18638716340290198, "params_update_l1": 22.46555765460837,
                "ema_update_l2": 0.0008055765015757046, "ema_update_l1": 0.08224746566600065,
                "params_l2": 12.279288611747422, "ema_l2": 10.058127894617572}


def _l1_l2(tree) -> tuple[float, float]:
    flat = np.concatenate([np.asarray(leaf, np.float64).ravel() for leaf in jax.tree.leaves(tree)])
    return float(np.abs(flat).sum()), float(np.sqrt((flat * flat).sum()))


def test_ijepa_trainer_path_is_unchanged_up_to_the_cpus_float32_rounding():
    from jepa_cli.training.config import build_config
    from jepa_cli.training.run import build_optimizer
    from jepa_cli.training.state import init_state
    from jepa_cli.training.step import make_step_fn

    obj = make_objective("ijepa", dict(model="tiny", width=32, depth=1, heads=2, patch_size=4, image_size=16,
                                       channels=1, pred_depth=1, pred_width=16, npred=2, min_keep=2, total_updates=4))

    def hand_masks(key, b):
        ci = jnp.array([0, 1, 2, 3, 8, 9, 10, 11, 15, 15], jnp.int32)
        cv = jnp.arange(10) < 8
        ti = jnp.array([[5, 6, 0], [12, 13, 14]], jnp.int32)
        tv = jnp.array([[True, True, False], [True, True, True]])
        tile = lambda x: jnp.broadcast_to(x, (b, *x.shape))  # noqa: E731
        return SimpleNamespace(context_index=tile(ci)[:, None], context_valid=tile(cv)[:, None],
                               target_index=tile(ti), target_valid=tile(tv))

    obj.sample_masks = hand_masks
    lengths = {"steps": 4, "t_max": 4, "warmup_steps": 1, "ipe": 1}
    cfg = build_config({"steps": 4, "warmup_steps": 1})
    tx, lr_fn, wd_fn, m_fn = build_optimizer(cfg, obj, lengths,
                                             jax.eval_shape(obj.init, jax.ShapeDtypeStruct((2,), np.uint32)))
    state = init_state(obj, tx, jax.random.PRNGKey(1))
    initial = {"params": state.params, "ema": state.ema}
    step = jax.jit(make_step_fn(obj, tx, lr_fn, wd_fn, m_fn))
    images = np.random.default_rng(0).standard_normal((8, 16, 16, 1)).astype(np.float32)
    got = {}
    for update_index in (1, 2):
        state, metrics = step(state, {"image": images})
        got[f"loss_{update_index}"] = float(metrics["loss"])
    for name in ("params", "ema"):
        update = jax.tree.map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64),
                              getattr(state, name), initial[name])
        got[f"{name}_update_l1"], got[f"{name}_update_l2"] = _l1_l2(update)
        got[f"{name}_l2"] = _l1_l2(getattr(state, name))[1]
    assert got == pytest.approx(IJEPA_PINNED, rel=1e-5)


def test_latent_model_normalises_with_shift_and_scale_and_maps_back():
    """[N, D] latents: (z - shift) * scale for training, z / scale + shift on output; 8 tokens of D/8."""
    obj = make_objective("flow", dict(width=32, depth=1, heads=2, modality="latent", latent_shape=[16],
                                      latent_shift=[1.0] * 16, latent_scale=[0.5] * 16, num_classes=0))
    z = np.arange(16, dtype=np.float32)
    x = obj.train_transform()({"latent": z}, None)["latent"]
    np.testing.assert_allclose(x, (z - 1.0) * 0.5)
    np.testing.assert_allclose(obj.to_data(x[None])[0], z)
    assert obj.grid == (8,) and not obj.uses_labels


@pytest.mark.parametrize("name", ["flow", "diffusion"])
def test_flow_and_diffusion_on_an_audio_dataset_say_what_they_train_on(name):
    from jepa_cli.objectives import OBJECTIVES

    with pytest.raises(InputError, match=r"^flow and diffusion train on images or latents; the dataset given "
                                         r"\(--data\) is audio"):
        OBJECTIVES[name].dataset_options({"modality": "audio", "shape": [16000], "attrs": {"sample_rate": 16000}})


LATENT = dict(width=32, depth=1, heads=2, modality="latent", latent_shape=[16], num_classes=0)


@pytest.mark.parametrize("data, expected", [
    (TINY, ("edm2-pixel", -0.8, 1.6, 0.5)),  # EDM2 train_edm2.py edm2-img64-*; EDM's sigma_data for [-1, 1] pixels
    # edm2-img512-*, whose latents have std 0.5; these are standardised to std 1, so P_mean moves by ln 2
    (LATENT, ("edm2-latent", -0.4 + math.log(2.0), 1.0, 1.0)),
])
def test_edm_takes_its_preset_and_sigma_data_from_the_data(data, expected):
    c = make_objective("diffusion", {**data, "schedule": "edm"}).config
    assert c.edm_preset == expected[0]
    assert (c.p_mean, c.p_std, c.sigma_data) == pytest.approx(expected[1:], rel=1e-12)


def test_edm_options_the_user_sets_win_over_the_data_defaults():
    c = make_objective("diffusion", {**LATENT, "schedule": "edm", "edm_preset": "edm", "sigma_data": 0.7}).config
    # EDM Table 1, published at sigma_data 0.5: the same sigma / sigma_data at 0.7
    assert c.edm_preset == "edm"
    assert (c.p_mean, c.p_std, c.sigma_data) == pytest.approx((-1.2 + math.log(1.4), 1.2, 0.7), rel=1e-12)
    c = make_objective("diffusion", {**LATENT, "schedule": "edm", "p_mean": -1.0}).config
    assert (c.edm_preset, c.p_mean, c.p_std) == (None, -1.0, 1.0)  # p_std still the latent preset's


def test_a_recorded_edm_config_without_the_new_options_reads_back_unchanged():
    recorded = {**TINY, "schedule": "edm", "p_mean": -0.4, "p_std": 1.0, "sigma_data": 0.5}
    c = make_objective("diffusion", recorded).config
    assert (c.edm_preset, c.p_mean, c.p_std, c.sigma_data, c.edm_logvar) == (None, -0.4, 1.0, 0.5, False)
    assert make_objective("diffusion", c.to_dict()).config == c


def _edm_batch():
    x0 = jax.random.normal(jax.random.key(1), (4, 8, 8, 1))
    return {"image": x0, "label": jnp.arange(4)}


def _plain_edm_loss(obj, params, batch, key):
    """EDM's lambda-weighted x0 loss written out: mean over the batch of mean((F - (x0 - c_skip x) / c_out)^2)."""
    c = obj.config
    x0 = batch["image"]
    k_t, k_eps, _ = jax.random.split(key, 3)
    eps = jax.random.normal(k_eps, x0.shape, jnp.float32)
    sigma = jnp.exp(c.p_mean + c.p_std * jax.random.normal(k_t, (4,), jnp.float32))
    x = x0 + sigma[:, None, None, None] * eps
    c_skip, c_out, _, _ = edm_preconditioning(sigma, c.sigma_data)
    raw = obj.predict(params, x, sigma, batch["label"])  # cond_drop 0: the labels as given
    target = (x0 - c_skip[:, None, None, None] * x) / c_out[:, None, None, None]
    return sigma, jnp.mean(jnp.square(raw - target).reshape(4, -1), axis=1)


def _random_leaves(params, seed):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: x + 0.05 * rng.standard_normal(np.shape(x)).astype(np.float32), params)


def test_edm_without_logvar_has_no_head_and_the_plain_weighted_loss():
    obj = make_objective("diffusion", {**TINY, "schedule": "edm", "cond_drop": 0.0})
    params = _random_leaves(obj.init(jax.random.key(0)), 1)
    assert set(params) == {"dit"}  # the checkpoint's tree is the one without the option
    key = jax.random.key(2)
    loss, aux = obj.loss(params, None, _edm_batch(), key, 0)
    _, per_example = _plain_edm_loss(obj, params, _edm_batch(), key)
    np.testing.assert_allclose(loss, jnp.mean(per_example), rtol=1e-6)
    assert "logvar_mean" not in aux


def test_edm_logvar_head_gives_one_log_variance_per_example_and_starts_at_zero():
    obj = make_objective("diffusion", {**TINY, "schedule": "edm", "edm_logvar": True})
    params = obj.init(jax.random.key(0))
    assert params["logvar"]["weight"].shape == (128,) and params["logvar"]["bias"].shape == ()
    u = obj.logvar(params, jnp.array([0.01, 1.0, 80.0]))
    assert u.shape == (3,) and float(jnp.abs(u).max()) == 0.0


def test_edm_logvar_loss_is_weighted_error_over_exp_u_plus_u():
    # EDM2 training_loop.py EDM2Loss: (weight / logvar.exp()) * (denoised - images)^2 + logvar
    obj = make_objective("diffusion", {**TINY, "schedule": "edm", "edm_logvar": True, "cond_drop": 0.0})
    params = _random_leaves(obj.init(jax.random.key(0)), 1)
    key = jax.random.key(2)
    loss, aux = obj.loss(params, None, _edm_batch(), key, 0)
    sigma, per_example = _plain_edm_loss(obj, params, _edm_batch(), key)
    c_noise = np.log(np.asarray(sigma, np.float64)) / 4
    rng = np.random.default_rng(0)  # the head's fixed Fourier frequencies, then phases
    freqs, phases = rng.standard_normal(128), rng.random(128)
    features = np.sqrt(2) * np.cos(2 * np.pi * (np.outer(c_noise, freqs.astype(np.float32))
                                                + phases.astype(np.float32)))
    u = features @ np.asarray(params["logvar"]["weight"], np.float64) + float(params["logvar"]["bias"])
    expected = np.mean(np.asarray(per_example, np.float64) * np.exp(-u) + u)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    np.testing.assert_allclose(aux["logvar_mean"], u.mean(), rtol=1e-5, atol=1e-6)


def test_edm_logvar_head_receives_a_gradient():
    obj = make_objective("diffusion", {**TINY, "schedule": "edm", "edm_logvar": True})
    params = _random_leaves(obj.init(jax.random.key(0)), 1)
    grads = jax.grad(lambda head: obj.loss({**params, "logvar": head}, None, _edm_batch(), jax.random.key(2), 0)[0])(
        params["logvar"])
    assert float(jnp.abs(grads["weight"]).max()) > 1e-4 and float(jnp.abs(grads["bias"])) > 1e-4


def test_edm_logvar_is_refused_with_the_cosine_schedule():
    with pytest.raises(InputError, match="edm_logvar applies to the edm schedule"):
        make_objective("diffusion", {**TINY, "edm_logvar": True})
