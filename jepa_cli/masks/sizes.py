"""The static sizes of a mask config: the block sizes a draw can give, the target slot count T and
the largest context a draw can give, which fix the samplers' array shapes (docs/masks.md; the
derived context slot count K, which draws masks, is masks/sampler.py's `context_slots`)."""

from __future__ import annotations

import functools
import math

from jepa_cli.masks.config import MaskConfig, MultiBlock3DConfig, MultiBlockConfig

# ---------------------------------------------------------------------------------------------
# Block sizes: the exact set of (h, w) a size draw can produce, for static shapes and validation.


def _round_half_even(x: float) -> int:
    return int(round(x))


def block_hw(k: int, ar: float, grid: tuple[int, int], below_grid: bool) -> tuple[int, int]:
    """h = round(sqrt(k*ar)), w = round(sqrt(k/ar)); kept below (I-JEPA) or within (V-JEPA) the grid."""
    H, W = grid
    h = _round_half_even(math.sqrt(k * ar))
    w = _round_half_even(math.sqrt(k / ar)) if ar > 0 else 0
    if below_grid:
        h, w = min(h, H - 1), min(w, W - 1)
    else:
        h, w = min(h, H), min(w, W)
    return max(h, 0), max(w, 0)


def _hw_over_aspect(k: int, ar_lo: float, ar_hi: float, grid, below_grid: bool) -> set[tuple[int, int]]:
    """Every (h, w) reachable for a fixed k while the aspect ratio runs over [ar_lo, ar_hi]."""
    points = {ar_lo, ar_hi}
    if k > 0 and ar_hi > ar_lo:
        # h steps while sqrt(k*ar) < n + 0.5, w while sqrt(k/ar) < n + 0.5; steps past the grid size
        # are clamped away, which also bounds the loop for an extreme aspect
        hi_n = min(int(math.sqrt(k * max(ar_hi, 1 / ar_lo))) + 2, max(grid) + 1)
        for n in range(hi_n + 1):
            edge = (n + 0.5) ** 2
            for ar in (edge / k, k / edge):  # where round(sqrt(k*ar)) or round(sqrt(k/ar)) steps
                if ar_lo <= ar <= ar_hi:
                    points.update((ar * (1 - 1e-9), ar, ar * (1 + 1e-9)))
    points = sorted(p for p in points if ar_lo <= p <= ar_hi)
    mids = [(a + b) / 2 for a, b in zip(points, points[1:])]
    return {block_hw(k, ar, grid, below_grid) for ar in points + mids}


@functools.lru_cache(maxsize=None)
def block_sizes(grid: tuple[int, int], scale: tuple[float, float], aspect: tuple[float, float],
                correlated: bool, below_grid: bool) -> frozenset[tuple[int, int]]:
    """The set of block (h, w) a size draw can give (a superset at floating-point boundaries).

    `correlated`: one uniform draw sets both scale and aspect (I-JEPA); otherwise they are independent
    draws (V-JEPA).
    """
    H, W = grid
    n = H * W
    s_lo, s_hi = scale
    a_lo, a_hi = aspect
    out: set[tuple[int, int]] = set()
    for k in range(int(n * s_lo), int(n * s_hi) + 1):
        if correlated and s_hi > s_lo:
            r0 = (k / n - s_lo) / (s_hi - s_lo)
            r1 = ((k + 1) / n - s_lo) / (s_hi - s_lo)
            r0, r1 = max(0.0, r0 - 1e-6), min(1.0, r1 + 1e-6)
            if r0 > r1:
                continue
            lo, hi = a_lo + r0 * (a_hi - a_lo), a_lo + r1 * (a_hi - a_lo)
        else:
            lo, hi = a_lo, a_hi
        out |= _hw_over_aspect(k, lo, hi, grid, below_grid)
    return frozenset(out)


def multiblock_target_sizes(config: MultiBlockConfig) -> frozenset[tuple[int, int]]:
    return block_sizes(config.grid, config.pred_scale, config.aspect, True, True)


def multiblock_context_sizes(config: MultiBlockConfig) -> frozenset[tuple[int, int]]:
    return block_sizes(config.grid, config.enc_scale, config.enc_aspect, True, True)


def temporal_sizes(frames: int, scale: tuple[float, float]) -> list[int]:
    """t = max(1, int(frames * s)) for s in the scale range (V-JEPA)."""
    lo, hi = int(frames * scale[0]), int(frames * scale[1])
    return sorted({max(1, t) for t in range(lo, hi + 1)})


def multiblock3d_sizes(config: MultiBlock3DConfig, pair: int) -> tuple[list[int], frozenset[tuple[int, int]]]:
    return (temporal_sizes(config.frames, config.temporal_scale[pair]),
            block_sizes(config.grid, config.pred_scale[pair], config.aspect, False, False))


def context_frames(config: MultiBlock3DConfig, pair: int) -> int:
    """Frames the context may span (V-JEPA max_context_duration)."""
    return max(1, int(config.frames * config.max_temporal_keep[pair]))


# ---------------------------------------------------------------------------------------------
# Static shapes


def num_contexts(config: MaskConfig) -> int:
    return config.pairs if isinstance(config, MultiBlock3DConfig) else 1


def num_targets(config: MaskConfig) -> int:
    if isinstance(config, MultiBlockConfig):
        return config.npred
    if isinstance(config, MultiBlock3DConfig):
        return config.pairs
    return 1


def max_context_count(config: MaskConfig) -> int:
    """The largest context a single sample can have (the K that never drops a token)."""
    if isinstance(config, MultiBlockConfig):
        return max(h * w for h, w in multiblock_context_sizes(config))
    if isinstance(config, MultiBlock3DConfig):
        H, W = config.grid
        best = 0
        for p in range(config.pairs):
            ts, hws = multiblock3d_sizes(config, p)
            smallest = min(ts) * min(h * w for h, w in hws)
            best = max(best, min(context_frames(config, p) * H * W, config.num_patches - smallest))
        return max(best, 1)
    n = config.num_patches
    return max(1, int(n * (1 - config.ratio[0])))


def target_slots(config: MaskConfig) -> int:
    """T: the static number of slots per target set (the largest target set)."""
    if isinstance(config, MultiBlockConfig):
        return max(h * w for h, w in multiblock_target_sizes(config))
    if isinstance(config, MultiBlock3DConfig):
        H, W = config.grid
        best = 0
        for p in range(config.pairs):
            ts, hws = multiblock3d_sizes(config, p)
            blocks = config.npred[p] * max(ts) * max(h * w for h, w in hws)
            outside = (config.frames - context_frames(config, p)) * H * W
            best = max(best, min(config.num_patches, blocks + outside))
        return best
    n = config.num_patches
    return n - int(n * (1 - config.ratio[1]))
