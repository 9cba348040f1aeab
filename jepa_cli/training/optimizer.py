"""AdamW with the scheduled learning rate and weight decay, a weight-decay mask and optional clipping.

Decoupled weight decay as torch.optim.AdamW: p <- p - lr * (adam_update + wd * p) on masked leaves.
The schedules are evaluated at the optimizer's own update count, so with gradient accumulation
(done inside the step, see step.py) they advance once per update, never per micro-batch.

Which leaves decay is the objective's rule (`Objective.weight_decay_mask`, objectives/base.py).
The chain is written here rather than taken from optax.adamw, which computes the same update with a
scheduled decay: its state is three entries (Adam moments, the masked decay's count, the learning
rate's count) where this chain's is two, and every checkpoint already written stores this layout.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jepa_cli.training.schedules import Schedule


class ScheduledDecayState(NamedTuple):
    count: jnp.ndarray  # int32 scalar: updates applied so far


def scheduled_decay_and_lr(lr: Schedule, wd: Schedule, mask: Any) -> optax.GradientTransformation:
    """updates <- -lr(count) * (updates + wd(count) * params[mask])."""

    def init_fn(params):
        del params
        return ScheduledDecayState(count=jnp.zeros([], jnp.int32))

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("scheduled weight decay needs params")
        lr_t = lr(state.count)
        wd_t = wd(state.count)

        def one(u, p, m):
            if isinstance(m, (bool, np.bool_)):
                if m:
                    u = u + wd_t * p
            else:
                u = u + jnp.where(m, wd_t, 0.0) * p
            return -lr_t * u

        new = jax.tree.map(one, updates, params, mask)
        return new, ScheduledDecayState(count=state.count + 1)

    return optax.GradientTransformation(init_fn, update_fn)


def clip_by_global_norm_from(max_norm: float, start: int) -> optax.GradientTransformation:
    """optax.clip_by_global_norm for updates `start` onwards; earlier updates pass unclipped (V-JEPA
    app/vjepa/train.py clips only once the warmup is over). State: the update count."""

    def init_fn(params):
        del params
        return ScheduledDecayState(count=jnp.zeros([], jnp.int32))

    def update_fn(updates, state, params=None):
        del params
        norm = optax.tree.norm(updates)
        clip = (state.count >= start) & (norm > max_norm)
        scale = jnp.where(clip, max_norm / jnp.where(clip, norm, 1.0), 1.0)
        return jax.tree.map(lambda u: u * scale.astype(u.dtype), updates), ScheduledDecayState(state.count + 1)

    return optax.GradientTransformation(init_fn, update_fn)


def make_optimizer(lr: Schedule, wd: Schedule, wd_mask: Any, clip_grad: float | None = None,
                   b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                   clip_start: int = 0) -> optax.GradientTransformation:
    """optax chain: [clip by global norm, from update `clip_start` on] -> Adam moments -> scheduled
    decoupled decay and LR."""
    parts = []
    if clip_grad and clip_start > 0:
        parts.append(clip_by_global_norm_from(float(clip_grad), int(clip_start)))
    elif clip_grad:
        parts.append(optax.clip_by_global_norm(float(clip_grad)))
    parts.append(optax.scale_by_adam(b1=b1, b2=b2, eps=eps))
    parts.append(scheduled_decay_and_lr(lr, wd, wd_mask))
    return optax.chain(*parts)

