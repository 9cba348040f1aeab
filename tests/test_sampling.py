"""Samplers and classifier-free guidance in an interval (Kynkaanniemi et al. 2024): exactness on one
compiled trajectory of a tiny DiT (random weights, so guidance changes the samples)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jepa_cli.errors import InputError
from jepa_cli.objectives import make_objective
from jepa_cli.objectives.diffusion import T_MAX
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

    def reference(scale, guided_steps):
        """The Euler trajectory written out step by step, guided at the steps listed: no plan, no scan."""
        times = obj.sampling_times(4)
        k_prior, _ = jax.random.split(jax.random.key(7))
        x = obj.prior(k_prior, (4, *obj.sample_shape))
        null = jnp.full_like(labels, obj.null_class)
        for i in range(4):
            t = jnp.full((4,), times[i], jnp.float32)
            c = obj.predict(params, x, t, labels)
            raw = guide(c, obj.predict(params, x, t, null), scale) if i in guided_steps else c
            x = x + (times[i + 1] - times[i]) * raw
        return np.asarray(x)

    run.reference = reference
    return obj, run


def guided_steps(plan) -> list[int]:
    """The steps a guidance plan guides."""
    return [i for first, end, guided, _second in plan if guided for i in range(first, end)]


@pytest.mark.parametrize("interval, expected", [((0.3, 0.7), [3, 4, 5, 6]), ((0.2, 0.8), [2, 3, 4, 5, 6, 7])])
def test_flow_bounds_on_grid_points_exclude_lo_and_include_hi(interval, expected):
    # 10 flow steps start at t = 1, 0.9, ..., 0.1: (0.3, 0.7] holds 0.7 .. 0.4, (0.2, 0.8] holds 0.8 .. 0.3
    obj = make_objective("flow", TINY)
    for sampler in ("euler", "ddim"):
        assert guided_steps(guidance_plan(obj, 10, sampler, 2.0, interval)) == expected


def test_edm_bounds_at_sigma_min_and_sigma_max_exclude_lo_and_include_hi():
    # Karras' 8-step grid starts at sigma 80 .. 0.002 (float32 0.002 is 0.0020000001)
    obj = make_objective("diffusion", dict(TINY, schedule="edm"))
    assert guided_steps(guidance_plan(obj, 8, "euler", 2.0, (0.002, 80.0))) == [0, 1, 2, 3, 4, 5, 6]
    assert guided_steps(guidance_plan(obj, 8, "heun", 2.0, (0.002, 80.0))) == [0, 1, 2, 3, 4, 5, 6]
    assert guided_steps(guidance_plan(obj, 8, "euler", 2.0, (0.0, 0.002))) == [7]


def test_cosine_bounds_on_grid_levels_exclude_lo_and_include_hi():
    # 4 DDIM steps start at t = T_MAX (1 - i / 4); a bound typed as that step's sigma / alpha = tan(pi t / 2)
    obj = make_objective("diffusion", TINY)
    level = [math.tan(0.5 * math.pi * T_MAX * (1 - i / 4)) for i in range(4)]
    assert guided_steps(guidance_plan(obj, 4, "ddim", 2.0, (level[3], level[1]))) == [1, 2]
    assert guided_steps(guidance_plan(obj, 4, "ddim", 2.0, (level[2], level[0]))) == [0, 1]


@pytest.mark.slow
def test_guidance_plan_guides_exactly_the_steps_in_the_interval(setup):
    obj, _ = setup
    # flow times 1, 0.75, 0.5, 0.25 (then 0): (0.4, 0.8] holds 0.75 and 0.5
    assert guidance_plan(obj, 4, "euler", 3.0, (0.4, 0.8)) == [(0, 1, False, False),
                                                                 (1, 3, True, False),
                                                                 (3, 4, False, False)]
    assert guidance_plan(obj, 4, "euler", 1.0, None) == [(0, 4, False, False)]  # scale 1: never
    assert guidance_plan(obj, 4, "heun", 3.0, None) == [(0, 3, True, True), (3, 4, True, False)]


def test_guidance_scale_1_is_exactly_the_conditional_prediction():
    c, u = jnp.array([0.3, -1.7, 2.0]), jnp.array([5.0, 0.1, -3.0])
    np.testing.assert_array_equal(guide(c, u, 1.0), c)
    np.testing.assert_allclose(guide(c, u, 3.0), u + 3.0 * (c - u), rtol=1e-6)  # Ho & Salimans 2022


@pytest.mark.slow
def test_interval_covering_every_level_is_guided_at_every_step(setup):
    _, run = setup
    # flow t lies in (0, 1] at every step; the reference guides every step without a plan or a scan
    np.testing.assert_allclose(run(3.0, 0.0, 1.0), run.reference(3.0, {0, 1, 2, 3}), atol=1e-5)


@pytest.mark.slow
def test_empty_interval_and_scale_1_are_the_conditional_sampler(setup):
    _, run = setup
    conditional = run.reference(3.0, set())
    np.testing.assert_allclose(run(3.0, 0.5, 0.5), conditional, atol=1e-5)
    np.testing.assert_allclose(run(1.0, 0.0, 1.0), conditional, atol=1e-5)
    assert np.abs(run.reference(3.0, {0, 1, 2, 3}) - conditional).max() > 1e-3  # guidance changes the samples


@pytest.mark.slow
def test_partial_interval_guides_only_its_steps(setup):
    _, run = setup
    # flow times 1, 0.75, 0.5, 0.25: (0.4, 0.8] guides steps 1 and 2
    np.testing.assert_allclose(run(3.0, 0.4, 0.8), run.reference(3.0, {1, 2}), atol=1e-5)


@pytest.mark.slow
def test_partial_interval_differs_from_both(setup):
    _, run = setup
    part = run(3.0, 0.4, 0.8)
    assert np.abs(part - run(3.0)).max() > 1e-4 and np.abs(part - run(1.0)).max() > 1e-4


@pytest.mark.slow
def test_ddim_with_eta_0_is_the_euler_step_on_the_linear_path(setup):
    obj, _ = setup
    rng = np.random.default_rng(0)
    x, v = (jnp.asarray(rng.standard_normal((2, 8, 8, 1)), jnp.float32) for _ in range(2))
    t, s = jnp.float32(0.7), jnp.float32(0.45)
    # (1 - s)(x - t v) + s (x + (1 - t) v) = x + (s - t) v: equal up to float rounding
    np.testing.assert_allclose(ddim_step(obj, v, x, t, s), euler_step(obj, v, x, t, s), atol=1e-6)


@pytest.mark.slow
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


@pytest.mark.slow
def test_absurdly_many_sampling_steps_are_refused_before_planning(setup):
    obj, _ = setup
    with pytest.raises(InputError, match=r"--steps must be in 1\.\.10000, got 1000000000"):
        make_sampler(obj, steps=10**9)
