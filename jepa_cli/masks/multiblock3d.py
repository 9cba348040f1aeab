"""V-JEPA 3D multi-block masks in JAX (semantics of facebookresearch/jepa src/masks/multiblock3d.py).

Per mask pair and batch: three independent uniform draws set a block's temporal length, spatial
scale and aspect. Per sample: `npred` blocks at uniform positions (inclusive bounds); the target is
their union (plus every frame past the context's temporal limit), the context its complement; an
empty context is redrawn.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jepa_cli.masks.config import (MAX_EMPTY_CONTEXT_RETRIES, MaskSet, MultiBlock3DConfig, context_frames,
                                   context_slots, target_slots)
from jepa_cli.masks.indexing import dense_to_index


def block_size_3d(key: jax.Array, config: MultiBlock3DConfig, pair: int):
    """(t, h, w) int32 for one pair: temporal scale, spatial scale and aspect are independent draws."""
    H, W = config.grid
    ut, us, ua = jax.random.uniform(key, (3,))
    t_lo, t_hi = config.temporal_scale[pair]
    t = jnp.maximum(1, jnp.floor(config.frames * (t_lo + ut * (t_hi - t_lo)))).astype(jnp.int32)
    s_lo, s_hi = config.pred_scale[pair]
    k = jnp.floor(H * W * (s_lo + us * (s_hi - s_lo)))
    ar = config.aspect[0] + ua * (config.aspect[1] - config.aspect[0])
    h = jnp.minimum(jnp.round(jnp.sqrt(k * ar)).astype(jnp.int32), H)
    w = jnp.minimum(jnp.round(jnp.sqrt(k / ar)).astype(jnp.int32), W)
    return t, h, w


def _block(key, config: MultiBlock3DConfig, t, h, w):
    """Dense bool [D*H*W] of one block at a uniform position (randint(0, H - h + 1))."""
    D, (H, W) = config.frames, config.grid
    kt, kh, kw = jax.random.split(key, 3)
    start = jax.random.randint(kt, (), 0, D - t + 1)
    top = jax.random.randint(kh, (), 0, H - h + 1)
    left = jax.random.randint(kw, (), 0, W - w + 1)
    f = jnp.arange(D)[:, None, None]
    r = jnp.arange(H)[None, :, None]
    c = jnp.arange(W)[None, None, :]
    inside = ((f >= start) & (f < start + t) & (r >= top) & (r < top + h) & (c >= left) & (c < left + w))
    return inside.reshape(-1)


def _one_pair(key, config: MultiBlock3DConfig, pair: int, size):
    """Dense (target, context) [N] of one sample for one pair."""
    D, (H, W) = config.frames, config.grid
    npred = config.npred[pair]
    outside = jnp.repeat(jnp.arange(D) >= context_frames(config, pair), H * W)

    def attempt(state):
        key, n, _ = state
        key, sub = jax.random.split(key)
        blocks = jax.vmap(lambda k: _block(k, config, *size))(jax.random.split(sub, npred))
        return key, n + 1, jnp.any(blocks, axis=0) | outside

    def empty(state):
        return jnp.all(state[2]) & (state[1] < MAX_EMPTY_CONTEXT_RETRIES)

    init = (key, jnp.int32(0), jnp.ones(D * H * W, bool))
    _, _, target = jax.lax.while_loop(empty, attempt, init)
    return target, ~target


def sample_multiblock3d(key: jax.Array, config: MultiBlock3DConfig, batch_size: int) -> MaskSet:
    k_size, k_samples, k_select = jax.random.split(key, 3)
    size_keys = jax.random.split(k_size, config.pairs)
    sample_keys = jax.random.split(k_samples, config.pairs)
    targets, contexts = [], []
    for p in range(config.pairs):
        size = block_size_3d(size_keys[p], config, p)
        t, c = jax.vmap(lambda k: _one_pair(k, config, p, size))(jax.random.split(sample_keys[p], batch_size))
        targets.append(t)
        contexts.append(c)
    targets = jnp.stack(targets, axis=1)  # [B, P, N]
    contexts = jnp.stack(contexts, axis=1)
    c_index, c_valid = dense_to_index(k_select, contexts, context_slots(config), config.official_truncation)
    t_index, t_valid = dense_to_index(None, targets, target_slots(config), config.official_truncation)
    return MaskSet(c_index, c_valid, t_index, t_valid)
