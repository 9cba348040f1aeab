"""Whole sampling trajectories under one jit, with classifier-free guidance limited to an interval.

Guidance (Ho & Salimans 2022) combines the conditional prediction c and the unconditional one u
(the null class) as c + (w - 1) (c - u) = u + w (c - u), only at steps whose noise level at the
step's start (objective.guidance_levels: t for flow, sigma for diffusion) lies in (lo, hi]
(Kynkaanniemi et al. 2024); a guided step guides every evaluation it makes, Heun's second one at
the step's end included, as kynkaat/guidance-interval sampling/edm_sampler.py decides once per step
from t_cur. Elsewhere the step uses c alone from a pass over the batch, and the unconditional pass
is skipped; inside, c and u come from one pass over the doubled batch. Which steps are guided is
decided before tracing (guided_steps, guidance_plan), so the compiled trajectory has no runtime
branch. The test is made in float32, the precision the network sees the grid in: a bound the user
types equal to a grid point (0.3 on a 10-step flow grid) is that grid point, whatever the last
bits of either (float32 0.3 is 0.30000001, float64 1 - 7/10 is 0.30000000000000004).
With w = 1 the combination is c + 0 (c - u) = c exactly, so scale 1 is the conditional prediction.

Samplers: euler and heun integrate the probability-flow ODE dx/dtime = objective.derivative(...);
ddim (Song et al. 2021, eq. 12) steps x_s = alpha_s x0 + sqrt(sigma_s^2 - c^2) eps + c z with
c = eta sigma_s sqrt(1 - SNR_t / SNR_s); on the linear flow path with eta 0 it is the Euler step.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from jepa_cli.errors import InputError
from jepa_cli.objectives.genconfig import ETA_RANGE, MAX_SAMPLING_STEPS

SAMPLERS = ("euler", "heun", "ddim")


def guide(c, u, scale):
    """Classifier-free guidance: c + (w - 1)(c - u); exactly c at w = 1."""
    return c + (scale - 1.0) * (c - u)


def in_interval(level, lo, hi):
    """Whether a noise level lies in the guidance interval (lo, hi]."""
    return (level > lo) & (level <= hi)


def guided_steps(objective, steps: int, interval) -> list[bool]:
    """Per step i = 0..steps - 1, whether the noise level it starts from lies in the guidance interval
    (lo, hi] (None: every step). Levels and bounds are both rounded to float32 first, so a bound equal
    to a grid point is that point: lo excludes it, hi includes it."""
    lo, hi = check_interval(objective, interval)
    levels = np.asarray(objective.guidance_levels(steps), np.float64).astype(np.float32)[:steps]
    with np.errstate(over="ignore"):  # a sigma bound beyond float32's range is +inf there, as intended
        lo32, hi32 = np.float32(lo), np.float32(hi)
    return [bool(in_interval(v, lo32, hi32)) for v in levels]


def euler_step(objective, raw, x, t, t_next):
    return x + (t_next - t) * objective.derivative(raw, x, t)


def ddim_step(objective, raw, x, t, t_next, eta=0.0, noise=None):
    x0, eps = objective.to_x0_eps(raw, x, t)
    a_t, s_t = objective.alpha_sigma(t)
    a_n, s_n = objective.alpha_sigma(t_next)
    if noise is None or eta == 0.0:
        return a_n * x0 + s_n * eps
    ratio = jnp.where(s_n > 0, (a_t * s_n) ** 2 / ((a_n * s_t) ** 2), 0.0)  # SNR_t / SNR_s
    c = eta * s_n * jnp.sqrt(jnp.clip(1.0 - ratio, 0.0, 1.0))
    return a_n * x0 + jnp.sqrt(jnp.maximum(s_n * s_n - c * c, 0.0)) * eps + c * noise


def check_interval(objective, interval) -> tuple[float, float]:
    """(lo, hi) of a guidance interval, None meaning the whole trajectory; InputError for LO > HI or
    values outside the objective's range of noise levels."""
    low, high = objective.guidance_range()
    if interval is None:
        return -math.inf, math.inf
    lo, hi = (float(v) for v in interval)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise InputError(f"--guidance-interval must be two finite numbers, got {lo},{hi}")
    if lo > hi:
        raise InputError(f"--guidance-interval LO,HI needs LO <= HI, got {lo:g},{hi:g}")
    if lo < low or hi > high:
        what = "t" if high == 1.0 else "sigma"
        raise InputError(f"--guidance-interval {lo:g},{hi:g} lies outside the {objective.name} noise levels "
                         f"({what} in [{low:g}, {high:g}])")
    return lo, hi


def check_interval_guides(objective, steps: int, scale: float, interval) -> None:
    """InputError when a guidance scale other than 1 is given with an interval that guides none of the
    `steps` steps (guided_steps, the sampler's own decision): the samples would be the unguided ones,
    while the dataset's attributes record the scale."""
    if interval is None or scale == 1.0 or any(guided_steps(objective, steps, interval)):
        return
    lo, hi = check_interval(objective, interval)
    levels = np.asarray(objective.guidance_levels(steps), np.float64).astype(np.float32)[:steps]
    below, above = levels[levels <= np.float32(lo)], levels[levels > np.float32(hi)]
    nearest = " and ".join(f"{v:g}" for v in (above.min() if above.size else None,
                                              below.max() if below.size else None) if v is not None)
    what = "t" if objective.guidance_range()[1] == 1.0 else "sigma"
    raise InputError(f"--guidance-interval {lo:g},{hi:g} = ({lo:g}, {hi:g}] holds none of the {what} levels the "
                     f"--steps {steps} steps start from (the nearest: {nearest}), so --guidance-scale {scale:g} "
                     "would change nothing; widen the interval or give more --steps")


def guidance_plan(objective, steps: int, sampler: str, scale: float, interval) -> list[tuple[int, int, bool, bool]]:
    """The trajectory as contiguous runs of steps that share their static choices:
    (first step, end step, guide the step's evaluations, Heun's second evaluation happens). The
    interval and the time grid are known before tracing, so no step needs a runtime branch (a
    lax.cond inside the scan halved the speed on XLA:CPU)."""
    times = objective.sampling_times(steps)
    guided = [g and scale != 1.0 for g in guided_steps(objective, steps, interval)]
    flags = []
    for i in range(steps):
        second = sampler == "heun" and float(times[i + 1]) > 0.0  # Heun's last step to 0 is Euler's
        flags.append((guided[i], second))
    plan: list[tuple[int, int, bool, bool]] = []
    for i, f in enumerate(flags):
        if plan and plan[-1][2:] == f:
            plan[-1] = (plan[-1][0], i + 1, *f)
        else:
            plan.append((i, i + 1, *f))
    return plan


def make_sampler(objective, *, steps: int, sampler: str = "euler", eta: float = 0.0, scale: float = 1.0,
                 interval=None) -> Callable:
    """fn(params, key, labels [B]) -> samples [B, *sample_shape] in model space.

    The whole trajectory is one function of lax.scans (one per run of steps in guidance_plan);
    jit the result. A guided evaluation is one network pass over [x; x] with [labels; null]; an
    unguided one a pass over x with the labels."""
    if sampler not in SAMPLERS:
        raise InputError(f"unknown sampler {sampler!r} (choose from {', '.join(SAMPLERS)})")
    if not 1 <= steps <= MAX_SAMPLING_STEPS:
        raise InputError(f"--steps must be in 1..{MAX_SAMPLING_STEPS}, got {steps}")
    lo, hi = ETA_RANGE
    if not lo <= eta <= hi:  # also NaN, which compares false
        raise InputError(f"--eta must be a number in [{lo:g}, {hi:g}], got {eta}")
    if sampler != "ddim" and eta != 0.0:
        raise InputError("--eta applies to the ddim sampler")
    if sampler in ("euler", "heun") and objective.name == "diffusion" and objective.config.schedule == "cosine":
        raise InputError("the cosine schedule samples with ddim (euler and heun need the flow or edm ODE)")
    plan = guidance_plan(objective, steps, sampler, float(scale), interval)
    times = jnp.asarray(objective.sampling_times(steps), jnp.float32)
    null = objective.null_class
    w = float(scale)

    def sample(params, key, labels):
        b = labels.shape[0]
        k_prior, k_steps = jax.random.split(key)
        x = objective.prior(k_prior, (b, *objective.sample_shape))
        null_labels = jnp.full_like(labels, null)

        def model(x, t, guided: bool):
            tb = jnp.full((b,), t, jnp.float32)
            if not guided:
                return objective.predict(params, x, tb, labels)
            both = objective.predict(params, jnp.concatenate([x, x]), jnp.concatenate([tb, tb]),
                                     jnp.concatenate([labels, null_labels]))
            return guide(both[:b], both[b:], w)

        def make_body(guided: bool, second: bool):
            def body(x, i):
                t, t_next = times[i], times[i + 1]
                raw = model(x, t, guided)
                if sampler == "ddim":
                    noise = jax.random.normal(jax.random.fold_in(k_steps, i), x.shape) if eta else None
                    return ddim_step(objective, raw, x, t, t_next, eta, noise), None
                x_e = euler_step(objective, raw, x, t, t_next)
                if not second:
                    return x_e, None
                # Heun (Karras et al. 2022, Algorithm 1): average the slopes at t and t_next, the
                # second evaluation guided as the step is (kynkaat/guidance-interval edm_sampler.py)
                d1 = objective.derivative(raw, x, t)
                d2 = objective.derivative(model(x_e, t_next, guided), x_e, t_next)
                return x + (t_next - t) * 0.5 * (d1 + d2), None

            return body

        for first, end, guided, second in plan:
            x, _ = jax.lax.scan(make_body(guided, second), x, jnp.arange(first, end))
        return x

    return sample


def jit_sampler(fn: Callable, mesh=None) -> Callable:
    """jit with the batch (labels, outputs) sharded over the mesh's data axes, params replicated."""
    if mesh is None:
        return jax.jit(fn)
    from jepa_cli.training import mesh as meshlib

    batch, rep = meshlib.batch_sharding(mesh), meshlib.replicated(mesh)
    return jax.jit(fn, in_shardings=(rep, rep, batch), out_shardings=batch)


def sampling_batch_size(n: int, batch_size: int, mesh=None) -> int:
    """Samples per jitted trajectory: `batch_size`, at most n, rounded up to the mesh's data-parallel
    devices (the last batch is padded). Idempotent."""
    size = max(1, min(batch_size, n))  # a batch beyond n would only trace and fill padding
    if mesh is None:
        return size
    dp = int(mesh.shape["data"] * mesh.shape["fsdp"])
    return -(-size // dp) * dp


def sample_batches(objective, params: Any, labels: np.ndarray, *, steps: int, sampler: str = "euler",
                   eta: float = 0.0, scale: float = 1.0, interval=None, seed: int = 0, batch_size: int = 64,
                   mesh=None, batches: Iterable[int] | None = None,
                   on_progress: Callable[[int], None] | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """Samples for every label (the null class for an unconditional model), in batches of
    `sampling_batch_size(N, batch_size, mesh)` rows; batch i holds rows [i B, (i + 1) B) and uses
    the key fold_in(PRNGKey(seed), i), so any batch can be drawn alone (a resumed output). Yields
    (i, model-space float32 [b, *sample_shape]) for each batch in `batches` (default: all), in that
    order (b = B, fewer in the last), so that memory holds one batch, not N samples."""
    fn = jit_sampler(make_sampler(objective, steps=steps, sampler=sampler, eta=eta, scale=scale,
                                  interval=interval), mesh)
    n = len(labels)
    batch_size = sampling_batch_size(n, batch_size, mesh)
    if mesh is not None:
        from jepa_cli.training.mesh import replicated

        params = jax.device_put(params, replicated(mesh))
    base = jax.random.PRNGKey(seed)
    for i in range(-(-n // batch_size)) if batches is None else batches:
        a = i * batch_size
        y = np.asarray(labels[a:a + batch_size], np.int32)
        real = len(y)
        if real < batch_size:
            y = np.concatenate([y, np.full(batch_size - real, objective.null_class, np.int32)])
        x = fn(params, jax.random.fold_in(base, i), y)
        yield i, np.asarray(x)[:real]
        if on_progress:
            on_progress(real)
