"""Guidance decided once per step (kynkaat/guidance-interval sampling/edm_sampler.py), and EDM2's
noise levels in sigma / sigma_data terms (NVlabs/edm2 train_edm2.py, training/encoders.py)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jepa_cli.errors import InputError
from jepa_cli.objectives import make_objective
from jepa_cli.sampling.sampler import check_interval_guides, guidance_plan, make_sampler

TINY = dict(width=32, depth=1, heads=2, patch_size=2, image_size=8, channels=1, num_classes=10)


def karras_grid(steps, sigma_min=0.002, sigma_max=80.0, rho=7.0):
    """EDM eq. 5 written out: the sigma each step starts from."""
    a, b = sigma_max ** (1 / rho), sigma_min ** (1 / rho)
    return [(a + i / (steps - 1) * (b - a)) ** rho for i in range(steps)]


def test_the_8_step_edm_grid_with_interval_1_10_guides_both_evaluations_of_steps_3_and_4():
    sigmas = karras_grid(8)  # 80, 35.0, 13.7, 4.64, 1.29, 0.267, 0.0352, 0.002
    assert [i for i, s in enumerate(sigmas) if 1.0 < s <= 10.0] == [3, 4]
    obj = make_objective("diffusion", dict(TINY, schedule="edm"))
    # steps 3 and 4 guided whole: their second evaluations (sigma 1.29, 0.267) too; step 2's (4.64) not
    assert guidance_plan(obj, 8, "heun", 2.0, (1.0, 10.0)) == [(0, 3, False, True), (3, 5, True, True),
                                                                (5, 7, False, True), (7, 8, False, False)]


@pytest.fixture(scope="module")
def edm_model():
    obj = make_objective("diffusion", dict(TINY, schedule="edm"))
    params = obj.init(jax.random.key(0))
    # the zero-initialised leaves get random values: an untrained DiT outputs 0 for every class
    rng = np.random.default_rng(1)
    params = jax.tree.map(lambda x: x + 0.05 * rng.standard_normal(x.shape).astype(np.float32), params)
    return obj, params


@pytest.mark.slow
def test_heun_trajectory_matches_the_official_per_step_guidance(edm_model):
    obj, params = edm_model
    labels = jnp.array([1, 2, 3, 4], jnp.int32)
    null = jnp.full_like(labels, obj.null_class)
    w, steps = 3.0, 8
    got = np.asarray(jax.jit(make_sampler(obj, steps=steps, sampler="heun", scale=w, interval=(1.0, 10.0)))(
        params, jax.random.key(7), labels))

    def denoise(x, sigma, guided):  # edm_sampler.py: uncond.lerp(cond, G) when the step is guided
        s = jnp.full((4,), sigma, jnp.float32)
        cond = obj.to_x0_eps(obj.predict(params, x, s, labels), x, s)[0]
        if not guided:
            return cond
        uncond = obj.to_x0_eps(obj.predict(params, x, s, null), x, s)[0]
        return uncond + w * (cond - uncond)

    sigmas = [np.float32(s) for s in karras_grid(steps)] + [np.float32(0.0)]
    x = obj.prior(jax.random.split(jax.random.key(7))[0], (4, *obj.sample_shape))
    for i in range(steps):  # edm_sampler.py's loop: one decision from t_cur for both evaluations
        t_cur, t_next = sigmas[i], sigmas[i + 1]
        guided = 1.0 < t_cur <= 10.0
        d_cur = (x - denoise(x, t_cur, guided)) / t_cur
        x_next = x + (t_next - t_cur) * d_cur
        if i < steps - 1:
            d_prime = (x_next - denoise(x_next, t_next, guided)) / t_next
            x_next = x + (t_next - t_cur) * (0.5 * d_cur + 0.5 * d_prime)
        x = x_next
    np.testing.assert_allclose(got, np.asarray(x), rtol=2e-4, atol=2e-4)


def test_the_refusal_names_only_levels_a_step_starts_from():
    # 4 flow steps start from t = 1, 0.75, 0.5, 0.25; t = 0 ends the last one and is never evaluated
    obj = make_objective("flow", TINY)
    with pytest.raises(InputError) as info:
        check_interval_guides(obj, 4, 2.0, (0.0, 0.1))
    assert "(the nearest: 0.25)" in str(info.value)


LATENT = dict(width=32, depth=1, heads=2, modality="latent", latent_shape=[16], num_classes=10, schedule="edm")


def test_edm2_latent_training_median_sigma_over_sigma_data_is_edm2s():
    # EDM2 edm2-img512-*: P_mean -0.4 (train_edm2.py) on latents of std 0.5 (encoders.py final_std)
    c = make_objective("diffusion", LATENT).config
    assert c.edm_preset == "edm2-latent"
    assert math.exp(c.p_mean) / c.sigma_data == pytest.approx(math.exp(-0.4) / 0.5, rel=1e-12)


def test_edm2_latent_sampling_range_over_sigma_data_is_edm2s():
    # EDM2 samples sigma from 80 down to 0.002 (generate_images.py edm_sampler) at sigma_data 0.5
    obj = make_objective("diffusion", LATENT)
    grid = obj.sampling_grid(8) / obj.config.sigma_data
    assert (grid[0], grid[7], grid[8]) == pytest.approx((80.0 / 0.5, 0.002 / 0.5, 0.0), rel=1e-12)
    prior = obj.prior(jax.random.key(0), (4096, *obj.sample_shape)) / obj.config.sigma_data
    assert float(jnp.std(prior)) == pytest.approx(80.0 / 0.5, rel=0.02)  # x_0 = sigma_max noise
