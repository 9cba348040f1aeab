"""The official I-JEPA schedules (src/utils/schedulers.py, src/train.py) as pure jnp functions.

All are functions of the optimizer update index `step` (0-based, the number of updates already
applied). The official schedulers increment their counter before computing, so update `step`
uses the value at `step + 1`; the EMA momentum generator yields its first value (i = 0) after the
first update, so update `step` uses `i = step`.
"""

from __future__ import annotations

import math
from typing import Callable

import jax.numpy as jnp

Schedule = Callable[[jnp.ndarray], jnp.ndarray]


def total_steps(steps: int, ipe_scale: float = 1.0) -> int:
    """T_max = int(ipe_scale * steps) (official: int(ipe_scale * epochs * ipe))."""
    return max(1, int(ipe_scale * steps))


def ema_ramp_length(steps: int, ipe_scale: float = 1.0, ramp_steps: int | None = None,
                    ramp_epochs: float | None = None, ipe: int | None = None) -> float:
    """The EMA momentum ramp's length in updates. By default ipe_scale * steps, unrounded: the official
    I-JEPA generator divides by the float ipe * num_epochs * ipe_scale (src/train.py), where T_max for
    the LR is an int. `ramp_steps` (updates) or else `ramp_epochs` (x `ipe` updates per epoch, rounded)
    give the ramp a length of its own: Audio-JEPA's EMA callback ramps over len(train_dataloader) x
    max_epochs updates (src/callbacks/MA_weight_update_callback.py) while its run stops at max_steps."""
    if ramp_steps is not None:
        return float(max(1, int(ramp_steps)))
    if ramp_epochs is not None:
        if ipe is None:
            raise ValueError("ramp_epochs needs ipe, the updates per epoch")
        return float(max(1, int(round(float(ramp_epochs) * int(ipe)))))
    return max(1.0, float(ipe_scale) * int(steps))


def warmup_cosine(start_lr: float, ref_lr: float, final_lr: float, warmup_steps: int, t_max: int) -> Schedule:
    """Linear start_lr -> ref_lr over `warmup_steps`, then cosine to final_lr over t_max - warmup."""
    cosine_len = float(max(1, t_max - warmup_steps))
    warm = float(max(1, warmup_steps))

    def schedule(step):
        t = jnp.asarray(step, jnp.float32) + 1.0
        warm_lr = start_lr + (t / warm) * (ref_lr - start_lr)
        progress = (t - warmup_steps) / cosine_len
        cos_lr = final_lr + (ref_lr - final_lr) * 0.5 * (1.0 + jnp.cos(math.pi * progress))
        cos_lr = jnp.maximum(final_lr, cos_lr)
        return jnp.where(t < warmup_steps, warm_lr, cos_lr)

    return schedule


def cosine_wd(ref_wd: float, final_wd: float, t_max: int) -> Schedule:
    """Cosine ref_wd -> final_wd over t_max, clamped at final_wd (it rises in the official configs)."""

    def schedule(step):
        t = jnp.asarray(step, jnp.float32) + 1.0
        wd = final_wd + (ref_wd - final_wd) * 0.5 * (1.0 + jnp.cos(math.pi * t / t_max))
        return jnp.maximum(final_wd, wd) if final_wd <= ref_wd else jnp.minimum(final_wd, wd)

    return schedule
