"""Samplers and classifier-free guidance in an interval (Kynkaanniemi et al. 2024): exactness on one
compiled trajectory of a tiny DiT (random weights, so guidance changes the samples)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jepa_cli.errors import InputError
from jepa_cli.objectives import make_objective
from jepa_cli.sampling.sampler import check_interval, ddim_step, euler_step, guide, guidance_plan, make_sampler

TINY = dict(width=32, depth=1, heads=2, patch_size=2, image_size=8, channels=1, num_classes=10)


@pytest.fixture(scope="module")
def setup():
    obj = make_objective("flow", TINY)
    params = obj.init(jax.random.key(0))
    # the zero-initialised leaves get random values: an untrained DiT outputs 0 for every class
    rng = np.random.default_rng(1)
    params = jax.tree.map(lambda x: x + 0.05 * rng.standard_normal(x.shape).astype(np.float32), params)
    labels = jnp.array([1, 2, 3, 4], jnp.int32)
    compiled = {}  # one compile per guidance plan: settings with the same plan share the program

    def run(scale, lo=None, hi=None):
        interval = None if lo is None else (lo, hi)
        plan = (scale, tuple(guidance_plan(obj, 4, "euler", scale, interval)))
        if plan not in compiled:
            compiled[plan] = jax.jit(make_sampler(obj, steps=4, sampler="euler", scale=scale, interval=interval))
        return np.asarray(compiled[plan](params, jax.random.key(7), labels))

    return obj, run


def test_guidance_plan_guides_exactly_the_steps_in_the_interval(setup):
    obj, _ = setup
    # flow times 1, 0.75, 0.5, 0.25 (then 0): (0.4, 0.8] holds 0.75 and 0.5
    assert guidance_plan(obj, 4, "euler", 3.0, (0.4, 0.8)) == [(0, 1, False, False, False),
                                                                 (1, 3, True, False, False),
                                                                 (3, 4, False, False, False)]
    assert guidance_plan(obj, 4, "euler", 1.0, None) == [(0, 4, False, False, False)]  # scale 1: never
    assert guidance_plan(obj, 4, "heun", 3.0, None) == [(0, 3, True, True, True), (3, 4, True, False, False)]


def test_guidance_scale_1_is_exactly_the_conditional_prediction():
    c, u = jnp.array([0.3, -1.7, 2.0]), jnp.array([5.0, 0.1, -3.0])
    np.testing.assert_array_equal(guide(c, u, 1.0), c)
    np.testing.assert_allclose(guide(c, u, 3.0), u + 3.0 * (c - u), rtol=1e-6)  # Ho & Salimans 2022


def test_interval_covering_every_level_equals_plain_cfg(setup):
    _, run = setup
    np.testing.assert_array_equal(run(3.0, 0.0, 1.0), run(3.0))  # flow t lies in (0, 1] at every step


def test_empty_interval_equals_the_conditional_sampler(setup):
    _, run = setup
    conditional = run(1.0)
    np.testing.assert_array_equal(run(3.0, 0.5, 0.5), conditional)
    np.testing.assert_array_equal(run(1.0, 0.0, 1.0), conditional)
    assert np.abs(run(3.0) - conditional).max() > 1e-3  # guidance does change the samples


def test_partial_interval_differs_from_both(setup):
    _, run = setup
    part = run(3.0, 0.4, 0.8)
    assert np.abs(part - run(3.0)).max() > 1e-4 and np.abs(part - run(1.0)).max() > 1e-4


def test_ddim_with_eta_0_is_the_euler_step_on_the_linear_path(setup):
    obj, _ = setup
    rng = np.random.default_rng(0)
    x, v = (jnp.asarray(rng.standard_normal((2, 8, 8, 1)), jnp.float32) for _ in range(2))
    t, s = jnp.float32(0.7), jnp.float32(0.45)
    # (1 - s)(x - t v) + s (x + (1 - t) v) = x + (s - t) v: equal up to float rounding
    np.testing.assert_allclose(ddim_step(obj, v, x, t, s), euler_step(obj, v, x, t, s), atol=1e-6)


def test_bad_intervals_are_refused(setup):
    obj, _ = setup
    with pytest.raises(InputError, match="LO <= HI"):
        check_interval(obj, (0.8, 0.2))
    with pytest.raises(InputError, match="outside the flow noise levels"):
        check_interval(obj, (0.2, 1.5))
    diffusion = make_objective("diffusion", TINY)
    assert check_interval(diffusion, (0.3, 20.0)) == (0.3, 20.0)  # sigma has no upper bound
    with pytest.raises(InputError, match="ddim"):
        make_sampler(diffusion, steps=4, sampler="heun")


def test_a_sampling_batch_beyond_n_is_cut_to_n_rounded_up_to_the_devices():
    from types import SimpleNamespace

    from jepa_cli.sampling.sampler import sampling_batch_size

    two_devices = SimpleNamespace(shape={"data": 2, "fsdp": 1})
    assert sampling_batch_size(3, 10**9, two_devices) == 4
    assert sampling_batch_size(3, 10**9) == 3
    assert sampling_batch_size(100, 7, two_devices) == 8


def test_absurdly_many_sampling_steps_are_refused_before_planning(setup):
    obj, _ = setup
    with pytest.raises(InputError, match=r"--steps must be in 1\.\.10000, got 1000000000"):
        make_sampler(obj, steps=10**9)
