"""I-JEPA multi-block masks in JAX (semantics of facebookresearch/ijepa src/masks/multiblock.py).

One uniform draw per batch (per official collator call: `collator_batch` samples) sets a block's
scale and aspect (correlated), separately for the target and the context block; every sample draws its own positions. Targets first; the context block is
then restricted to the complement of the targets, redrawn while it keeps <= min_keep patches, and
after every 20 failures one more target complement is dropped from the restriction.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jepa_cli.errors import InputError
from jepa_cli.masks.config import CONTEXT_RETRY_TIMEOUT, MultiBlockConfig
from jepa_cli.masks.sizes import target_slots
from jepa_cli.masks.indexing import dense_to_index
from jepa_cli.masks.maskset import MaskSet
from jepa_cli.masks.rng import draw_bits, uniform


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


def corner(u: jax.Array, size: int, block: jax.Array, official_positions: bool) -> jax.Array:
    """A block's first row (or column) from a uniform u in [0, 1): uniform over every position that
    keeps the block inside the grid (ours), or over randint(0, size - block) (the official quirk)."""
    count = jnp.maximum(size - block + (0 if official_positions else 1), 1)
    return jnp.minimum(jnp.floor(u * count).astype(jnp.int32), count - 1)


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


def _context(u_attempts, targets, config: MultiBlockConfig, e_size):
    """The dense context of one sample: the context block minus the targets, redrawn (from the
    pre-drawn attempts [A, 2]) while it keeps <= min_keep patches; every 20 failures one more target
    complement is dropped from the constraint, so attempt 20 * npred + 1 always succeeds."""
    grid, npred = config.grid, config.npred

    def attempt(state):
        n, _, _ = state
        u = u_attempts[jnp.minimum(n, u_attempts.shape[0] - 1)]
        top = corner(u[0], grid[0], e_size[0], config.official_positions)
        left = corner(u[1], grid[1], e_size[1], config.official_positions)
        block = rectangle(grid, top, left, *e_size)
        if not config.allow_overlap:
            constrained = jnp.arange(npred) < npred - n // CONTEXT_RETRY_TIMEOUT
            block = block & ~jnp.any(targets & constrained[:, None], axis=0)
        return n + 1, block, block.sum() > config.min_keep

    init = (jnp.int32(0), jnp.zeros(grid[0] * grid[1], bool), jnp.bool_(False))
    # the last pre-drawn attempt is unconstrained and, for a validated config, always succeeds
    return jax.lax.while_loop(lambda s: ~s[2] & (s[0] < u_attempts.shape[0]), attempt, init)[1]


def collator_groups(config, batch_size: int) -> int:
    """How many official collator calls a batch stands for: batch_size / collator_batch (1 without
    collator_batch, or when it is not smaller than the batch). InputError when it does not divide."""
    g = config.collator_batch
    if not g or g >= batch_size:
        return 1
    if batch_size % g:
        raise InputError(f"batch {batch_size} is not a multiple of collator_batch {g} (the official per-GPU "
                         "batch that draws block sizes and cuts)")
    return batch_size // g


def sample_multiblock(key: jax.Array, config: MultiBlockConfig, batch_size: int, context_k: int) -> MaskSet:
    """Random numbers are drawn in bulk (a few call sites): fast to compile and to run. Block sizes
    are drawn once per collator call (per batch, or per `collator_batch` samples). Each context holds
    at most `context_k` slots (sampler.context_slots)."""
    grid, npred = config.grid, config.npred
    attempts = CONTEXT_RETRY_TIMEOUT * npred + 1
    n = grid[0] * grid[1]
    groups = collator_groups(config, batch_size)
    bits = draw_bits(key, size=(2,) if groups == 1 else (groups, 2), pos=(batch_size, npred, 2),
                     ctx=(batch_size, attempts, 2), select=(batch_size, 1, n))
    u_size = jnp.repeat(uniform(bits["size"]).reshape(groups, 2), batch_size // groups, axis=0)  # [B, 2]
    p_size = block_size(u_size[:, 0], grid, config.pred_scale, config.aspect)  # ([B], [B])
    e_size = block_size(u_size[:, 1], grid, config.enc_scale, config.enc_aspect)
    u_pos = uniform(bits["pos"])
    tops = corner(u_pos[..., 0], grid[0], p_size[0][:, None], config.official_positions)  # [B, M]
    lefts = corner(u_pos[..., 1], grid[1], p_size[1][:, None], config.official_positions)
    per_block = lambda f: jax.vmap(jax.vmap(f, in_axes=(0, 0, None, None)))  # noqa: E731 - over B, then M
    targets = per_block(lambda t, l, h, w: rectangle(grid, t, l, h, w))(tops, lefts, *p_size)  # [B, M, N]
    u_ctx = uniform(bits["ctx"])
    context = jax.vmap(lambda u, t, h, w: _context(u, t, config, (h, w)))(u_ctx, targets, *e_size)
    slots_t = target_slots(config)
    t_index, t_valid = per_block(lambda t, l, h, w: rectangle_index(grid, t, l, h, w, slots_t))(tops, lefts, *p_size)
    # every target block of a collator call has the same size h*w, so the official cut leaves targets whole
    c_index, c_valid = dense_to_index(bits["select"], context[:, None, :], context_k,
                                      config.official_truncation, config.collator_batch)
    return MaskSet(c_index, c_valid, t_index, t_valid)
