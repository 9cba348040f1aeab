"""V-JEPA 3D multi-block masks in JAX (semantics of facebookresearch/jepa src/masks/multiblock3d.py).

Per mask pair and batch: three independent uniform draws set a block's temporal length, spatial
scale and aspect. Per sample: `npred` blocks at uniform positions (inclusive bounds); the target is
their union (plus every frame past the context's temporal limit), the context its complement; an
empty context is redrawn.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jepa_cli.masks.config import MAX_EMPTY_CONTEXT_RETRIES, MultiBlock3DConfig
from jepa_cli.masks.sizes import context_frames, target_slots
from jepa_cli.masks.indexing import dense_to_index
from jepa_cli.masks.maskset import MaskSet
from jepa_cli.masks.rng import draw_bits, uniform


def block_size_3d(u: jax.Array, config: MultiBlock3DConfig, pair: int):
    """(t, h, w) int32 for one pair: temporal scale, spatial scale and aspect are independent draws."""
    H, W = config.grid
    ut, us, ua = u
    t_lo, t_hi = config.temporal_scale[pair]
    t = jnp.maximum(1, jnp.floor(config.frames * (t_lo + ut * (t_hi - t_lo)))).astype(jnp.int32)
    s_lo, s_hi = config.pred_scale[pair]
    k = jnp.floor(H * W * (s_lo + us * (s_hi - s_lo)))
    ar = config.aspect[0] + ua * (config.aspect[1] - config.aspect[0])
    h = jnp.minimum(jnp.round(jnp.sqrt(k * ar)).astype(jnp.int32), H)
    w = jnp.minimum(jnp.round(jnp.sqrt(k / ar)).astype(jnp.int32), W)
    return t, h, w


def _union(u, config: MultiBlock3DConfig, t, h, w, outside):
    """Dense bool [D*H*W]: the union of blocks placed by uniforms u [npred, 3] (randint(0, H - h + 1)),
    plus the frames the context may not span."""
    D, (H, W) = config.frames, config.grid

    def first(v, size, length):
        count = size - length + 1
        return jnp.minimum(jnp.floor(v * count).astype(jnp.int32), count - 1)

    start, top, left = first(u[:, 0], D, t), first(u[:, 1], H, h), first(u[:, 2], W, w)
    f = jnp.arange(D)[None, :]
    r = jnp.arange(H)[None, :]
    c = jnp.arange(W)[None, :]
    in_f = (f >= start[:, None]) & (f < start[:, None] + t)  # [npred, D]
    in_r = (r >= top[:, None]) & (r < top[:, None] + h)
    in_c = (c >= left[:, None]) & (c < left[:, None] + w)
    # union over blocks of in_f x in_r x in_c, as one small matmul: [D*H, npred] @ [npred, W]
    fr = (in_f[:, :, None] & in_r[:, None, :]).reshape(u.shape[0], D * H).astype(jnp.float32)
    hits = jnp.matmul(fr.T, in_c.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    return (hits > 0).reshape(-1) | outside


def _one_pair(u_attempts, config: MultiBlock3DConfig, pair: int, size):
    """Dense target [N] of one sample for one pair; the context is its complement. A draw that leaves
    the context empty is redrawn from the next pre-drawn attempt (up to MAX_EMPTY_CONTEXT_RETRIES)."""
    D, (H, W) = config.frames, config.grid
    outside = jnp.repeat(jnp.arange(D) >= context_frames(config, pair), H * W)

    def attempt(state):
        n, _ = state
        return n + 1, _union(u_attempts[n], config, *size, outside)

    def empty(state):
        return jnp.all(state[1]) & (state[0] < u_attempts.shape[0])

    init = (jnp.int32(0), jnp.ones(D * H * W, bool))
    return jax.lax.while_loop(empty, attempt, init)[1]


def sample_multiblock3d(key: jax.Array, config: MultiBlock3DConfig, batch_size: int, context_k: int) -> MaskSet:
    """A batch of V-JEPA multiblock3d masks; each context holds at most `context_k` slots (sampler.context_slots)."""
    P, R = config.pairs, MAX_EMPTY_CONTEXT_RETRIES
    shapes = {f"pos{p}": (batch_size, R, config.npred[p], 3) for p in range(P)}
    bits = draw_bits(key, size=(P, 3), select=(batch_size, P, config.num_patches), **shapes)
    u_size = uniform(bits["size"])
    targets = []
    for p in range(P):
        size = block_size_3d(u_size[p], config, p)
        u = uniform(bits[f"pos{p}"])
        targets.append(jax.vmap(lambda ua: _one_pair(ua, config, p, size))(u))
    targets = jnp.stack(targets, axis=1)  # [B, P, N]
    contexts = ~targets
    c_index, c_valid = dense_to_index(bits["select"], contexts, context_k,
                                      config.official_truncation, config.collator_batch)
    t_index, t_valid = dense_to_index(None, targets, target_slots(config), config.official_truncation,
                                      config.collator_batch)
    return MaskSet(c_index, c_valid, t_index, t_valid)
