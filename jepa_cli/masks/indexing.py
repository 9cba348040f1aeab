"""Dense boolean masks <-> the static-shape index form of a MaskSet.

Everything here is sort-free (cumulative sums, a scatter and a bisection), which keeps the samplers
fast on CPU as well as on accelerators.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jepa_cli.errors import InputError

_INVALID = 2**31 - 1
_KEY_BITS = 24
_KEY_END = 2**_KEY_BITS  # every key is below this; invalid members sit above it


def dense_to_index(bits: jax.Array | None, dense: jax.Array, slots: int, official_truncation: bool,
                   group: int | None = None) -> tuple[jax.Array, jax.Array]:
    """dense bool [B, S, N] -> (index int32 [B, S, slots], valid bool [B, S, slots]).

    Valid slots come first, in ascending index order; padded slots hold 0.
    - official_truncation: every set is cut to the minimum count over its group of `group`
      consecutive samples (the official collator's minimum over one GPU's batch; None: over the
      whole batch), per set index S, keeping the lowest indices. B must be a multiple of `group`.
    - otherwise, with `bits` (uint32, the shape of `dense`): a set larger than `slots` keeps a uniformly random subset of `slots`
      members (never biased to low indices); a smaller one is padded.
    - otherwise, without `bits`: the lowest `slots` members (targets, where `slots` holds every set).
    """
    if official_truncation:
        index, valid = compact(dense, slots)
        counts = dense.sum(-1)  # [B, S]
        b = counts.shape[0]
        g = b if not group or group >= b else int(group)
        if b % g:
            raise InputError(f"batch {b} is not a multiple of collator_batch {g} (the official per-GPU "
                             "batch the cut runs over)")
        per_group = counts.reshape(b // g, g, *counts.shape[1:])
        cut = jnp.broadcast_to(jnp.min(per_group, axis=1, keepdims=True), per_group.shape).reshape(counts.shape)
        valid = valid & (jnp.arange(slots) < cut[..., None])
        return jnp.where(valid, index, 0), valid
    if bits is not None:
        dense = random_subset(bits, dense, slots)
    return compact(dense, slots)


def random_subset(bits: jax.Array, dense: jax.Array, size: int) -> jax.Array:
    """A uniformly random subset of `size` members of each set (the whole set where it is smaller).

    Every member gets an iid random 24-bit key; the members whose key is below the `size`-th smallest
    key (found by bisection, 24 passes of compare-and-count) are kept. A tie at that key (probability
    about N / 2^24 per set) keeps one more member, which `compact` then trims.
    """
    keys = jnp.where(dense, (bits >> 8).astype(jnp.int32), _INVALID)
    count = dense.sum(-1, dtype=jnp.int32)
    need = jnp.minimum(count, size)[..., None].astype(jnp.float32)

    def bisect(_, bounds):
        lo, hi = bounds  # count(keys < lo) < need <= count(keys < hi)
        mid = lo + (hi - lo) // 2
        enough = _count(keys < mid) >= need
        return jnp.where(enough, lo, mid), jnp.where(enough, mid, hi)

    lo = jnp.zeros(need.shape, jnp.int32)
    hi = jnp.full(need.shape, _KEY_END, jnp.int32)
    _, threshold = jax.lax.fori_loop(0, _KEY_BITS, bisect, (lo, hi), unroll=True)
    return jnp.where(count[..., None] > size, keys < threshold, dense)


def _count(mask: jax.Array) -> jax.Array:
    """Members per set, [..., 1], as a float32 mat-vec (exact below 2^24; vectorizes well on CPU)."""
    ones = jnp.ones((mask.shape[-1], 1), jnp.float32)
    return jnp.matmul(mask.astype(jnp.float32), ones, precision=jax.lax.Precision.HIGHEST)


def cumsum_last(x: jax.Array) -> jax.Array:
    """Inclusive int32 cumulative sum over the last axis of a 0/1 array, blocked (fast on CPU too)."""
    n = x.shape[-1]
    if n <= 64:
        return jnp.cumsum(x, axis=-1, dtype=jnp.int32)
    block = 32
    padded = -(-n // block) * block
    xf = jnp.pad(x.astype(jnp.float32), [(0, 0)] * (x.ndim - 1) + [(0, padded - n)])
    xf = xf.reshape(x.shape[:-1] + (padded // block, block))
    upper = jnp.triu(jnp.ones((block, block), jnp.float32))  # exact in float32 for counts < 2^24
    inner = jnp.matmul(xf, upper, precision=jax.lax.Precision.HIGHEST)
    totals = inner[..., -1]
    offsets = jnp.cumsum(totals, axis=-1) - totals
    out = (inner + offsets[..., None]).reshape(x.shape[:-1] + (padded,))[..., :n]
    return out.astype(jnp.int32)


def compact(dense: jax.Array, slots: int) -> tuple[jax.Array, jax.Array]:
    """The lowest `slots` members of each set, ascending, padded with 0 / invalid."""
    n = dense.shape[-1]
    lead = dense.shape[:-1]
    flat = dense.reshape(-1, n)
    position = cumsum_last(flat) - 1
    slot = jnp.where(flat & (position < slots), position, slots)  # slot `slots` is a dump
    rows = jnp.arange(flat.shape[0])[:, None]
    members = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), flat.shape)
    index = jnp.zeros((flat.shape[0], slots + 1), jnp.int32).at[rows, slot].set(members)[:, :slots]
    valid = jnp.arange(slots) < jnp.minimum(position[:, -1] + 1, slots)[:, None]
    index = jnp.where(valid, index, 0)
    return index.reshape(lead + (slots,)), valid.reshape(lead + (slots,))


def index_to_dense(index: jax.Array, valid: jax.Array, num_patches: int) -> jax.Array:
    """index/valid [..., S, K] -> dense bool [..., S, N]."""
    lead = index.shape[:-1]
    flat_index = index.reshape(-1, index.shape[-1])
    flat_valid = valid.reshape(flat_index.shape)
    rows = jnp.arange(flat_index.shape[0])[:, None]
    dense = jnp.zeros((flat_index.shape[0], num_patches), jnp.int32)
    dense = dense.at[rows, flat_index].add(flat_valid.astype(jnp.int32))
    return (dense > 0).reshape(lead + (num_patches,))


def to_dense(maskset, num_patches: int) -> tuple[jax.Array, jax.Array]:
    """MaskSet -> (context bool [B, C, N], targets bool [B, M, N])."""
    return (index_to_dense(maskset.context_index, maskset.context_valid, num_patches),
            index_to_dense(maskset.target_index, maskset.target_valid, num_patches))
