"""I-JEPA multi-block masks in JAX (semantics of facebookresearch/ijepa src/masks/multiblock.py).

One uniform draw per batch sets a block's scale and aspect (correlated), separately for the target
and the context block; every sample draws its own positions. Targets first; the context block is
then restricted to the complement of the targets, redrawn while it keeps <= min_keep patches, and
after every 20 failures one more target complement is dropped from the restriction.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jepa_cli.masks.config import CONTEXT_RETRY_TIMEOUT, MaskSet, MultiBlockConfig, context_slots, target_slots
from jepa_cli.masks.indexing import dense_to_index


def block_size(u: jax.Array, grid: tuple[int, int], scale: tuple[float, float],
               aspect: tuple[float, float]) -> tuple[jax.Array, jax.Array]:
    """(h, w) int32 from one uniform u: scale and aspect both at u; kept below the grid size."""
    H, W = grid
    s = scale[0] + u * (scale[1] - scale[0])
    k = jnp.floor(H * W * s)
    ar = aspect[0] + u * (aspect[1] - aspect[0])
    h = jnp.round(jnp.sqrt(k * ar)).astype(jnp.int32)  # round half to even, as Python's round
    w = jnp.round(jnp.sqrt(k / ar)).astype(jnp.int32)
    return jnp.minimum(h, H - 1), jnp.minimum(w, W - 1)


def block_corner(key: jax.Array, grid: tuple[int, int], h: jax.Array, w: jax.Array,
                 official_positions: bool) -> tuple[jax.Array, jax.Array]:
    """Top-left corner: uniform over every position (ours) or randint(0, H - h) (official quirk)."""
    H, W = grid
    extra = 0 if official_positions else 1
    kt, kl = jax.random.split(key)
    top = jax.random.randint(kt, (), 0, jnp.maximum(H - h + extra, 1))
    left = jax.random.randint(kl, (), 0, jnp.maximum(W - w + extra, 1))
    return top, left


def rectangle(grid: tuple[int, int], top, left, h, w) -> jax.Array:
    """Dense bool [H*W] of the block."""
    H, W = grid
    rows = jnp.arange(H)[:, None]
    cols = jnp.arange(W)[None, :]
    inside = (rows >= top) & (rows < top + h) & (cols >= left) & (cols < left + w)
    return inside.reshape(-1)


def rectangle_index(grid: tuple[int, int], top, left, h, w, slots: int) -> tuple[jax.Array, jax.Array]:
    """The block's patch indices in ascending raster order, padded to `slots` with 0 / invalid."""
    W = grid[1]
    j = jnp.arange(slots)
    wd = jnp.maximum(w, 1)
    valid = j < h * w
    index = (top + j // wd) * W + left + j % wd
    return jnp.where(valid, index, 0).astype(jnp.int32), valid


def _one_sample(key, config: MultiBlockConfig, p_size, e_size):
    """Targets (corners) and the dense context of one sample."""
    grid, npred = config.grid, config.npred
    k_targets, k_context = jax.random.split(key)
    tops, lefts = jax.vmap(lambda k: block_corner(k, grid, *p_size, config.official_positions))(
        jax.random.split(k_targets, npred))
    targets = jax.vmap(lambda t, l: rectangle(grid, t, l, *p_size))(tops, lefts)  # [M, N]

    def attempt(state):
        key, n, _, _ = state
        key, sub = jax.random.split(key)
        top, left = block_corner(sub, grid, *e_size, config.official_positions)
        block = rectangle(grid, top, left, *e_size)
        if not config.allow_overlap:
            constrained = jnp.arange(npred) < npred - n // CONTEXT_RETRY_TIMEOUT
            block = block & ~jnp.any(targets & constrained[:, None], axis=0)
        return key, n + 1, block, block.sum() > config.min_keep

    init = (k_context, jnp.int32(0), jnp.zeros(grid[0] * grid[1], bool), jnp.bool_(False))
    _, _, context, _ = jax.lax.while_loop(lambda s: ~s[3], attempt, init)
    return tops, lefts, context


def sample_multiblock(key: jax.Array, config: MultiBlockConfig, batch_size: int) -> MaskSet:
    k_size, k_samples, k_select = jax.random.split(key, 3)
    u_pred, u_enc = jax.random.uniform(k_size, (2,))
    p_size = block_size(u_pred, config.grid, config.pred_scale, config.aspect)
    e_size = block_size(u_enc, config.grid, config.enc_scale, config.enc_aspect)
    tops, lefts, context = jax.vmap(lambda k: _one_sample(k, config, p_size, e_size))(
        jax.random.split(k_samples, batch_size))
    slots_t = target_slots(config)
    t_index, t_valid = jax.vmap(jax.vmap(lambda t, l: rectangle_index(config.grid, t, l, *p_size, slots_t)))(
        tops, lefts)
    # every target block of a batch has the same size h*w, so the official cut leaves targets whole
    c_index, c_valid = dense_to_index(k_select, context[:, None, :], context_slots(config),
                                      config.official_truncation)
    return MaskSet(c_index, c_valid, t_index, t_valid)
