"""A plain NumPy restatement of the official mask samplers, per sample, for parity tests and benchmarks.

Restated from the algorithms of facebookresearch/ijepa src/masks/multiblock.py and
facebookresearch/jepa src/masks/multiblock3d.py (torch replaced by a NumPy Generator); the quirks
are kept: exclusive position bounds in I-JEPA, batch-minimum lowest-index truncation in both.
"""

from __future__ import annotations

import math

import numpy as np


def ijepa_block_size(rng, grid, scale, aspect):
    H, W = grid
    r = rng.random()
    s = scale[0] + r * (scale[1] - scale[0])
    max_keep = int(H * W * s)
    ar = aspect[0] + r * (aspect[1] - aspect[0])
    h = int(round(math.sqrt(max_keep * ar)))
    w = int(round(math.sqrt(max_keep / ar)))
    while h >= H:
        h -= 1
    while w >= W:
        w -= 1
    return h, w


def ijepa_block_mask(rng, grid, size, min_keep, acceptable=None):
    H, W = grid
    h, w = size
    tries, timeout = 0, 20
    while True:
        top = rng.integers(0, H - h)  # exclusive upper bound, as the official randint(0, H - h)
        left = rng.integers(0, W - w)
        mask = np.zeros((H, W), np.int32)
        mask[top:top + h, left:left + w] = 1
        if acceptable is not None:
            for k in range(max(len(acceptable) - tries, 0)):
                mask *= acceptable[k]
        idx = np.nonzero(mask.ravel())[0]
        if len(idx) > min_keep:
            break
        timeout -= 1
        if timeout == 0:
            tries += 1
            timeout = 20
    complement = np.ones((H, W), np.int32)
    complement[top:top + h, left:left + w] = 0
    return idx, complement


def ijepa_collate(rng, batch_size, grid=(14, 14), npred=4, pred_scale=(0.15, 0.2), aspect=(0.75, 1.5),
                  enc_scale=(0.85, 1.0), min_keep=10, allow_overlap=False, truncate=True):
    """-> (enc [B, K] or list, pred [B, M, T] or list, p_size, e_size)."""
    p_size = ijepa_block_size(rng, grid, pred_scale, aspect)
    e_size = ijepa_block_size(rng, grid, enc_scale, (1.0, 1.0))
    enc, pred = [], []
    for _ in range(batch_size):
        masks_p, comps = [], []
        for _ in range(npred):
            m, c = ijepa_block_mask(rng, grid, p_size, min_keep)
            masks_p.append(m)
            comps.append(c)
        pred.append(masks_p)
        m, _ = ijepa_block_mask(rng, grid, e_size, min_keep, None if allow_overlap else comps)
        enc.append(m)
    if not truncate:
        return enc, pred, p_size, e_size
    kp = min(len(m) for ms in pred for m in ms)
    ke = min(len(m) for m in enc)
    return (np.stack([m[:ke] for m in enc]), np.stack([np.stack([m[:kp] for m in ms]) for ms in pred]),
            p_size, e_size)


def vjepa_block_size(rng, frames, grid, temporal_scale, spatial_scale, aspect):
    H, W = grid
    r = rng.random()
    t = max(1, int(frames * (temporal_scale[0] + r * (temporal_scale[1] - temporal_scale[0]))))
    r = rng.random()
    keep = int(H * W * (spatial_scale[0] + r * (spatial_scale[1] - spatial_scale[0])))
    r = rng.random()
    ar = aspect[0] + r * (aspect[1] - aspect[0])
    h = min(int(round(math.sqrt(keep * ar))), H)
    w = min(int(round(math.sqrt(keep / ar))), W)
    return t, h, w


def vjepa_generator(rng, batch_size, frames=8, grid=(14, 14), npred=8, spatial_scale=(0.15, 0.15),
                    temporal_scale=(1.0, 1.0), aspect=(0.75, 1.5), max_temporal_keep=1.0, truncate=True):
    """One official _MaskGenerator call -> (enc, pred, (t, h, w))."""
    H, W = grid
    t, h, w = vjepa_block_size(rng, frames, grid, temporal_scale, spatial_scale, aspect)
    ctx_frames = max(1, int(frames * max_temporal_keep))
    enc, pred = [], []
    for _ in range(batch_size):
        while True:
            mask_e = np.ones((frames, H, W), np.int32)
            for _ in range(npred):
                top = rng.integers(0, H - h + 1)
                left = rng.integers(0, W - w + 1)
                start = rng.integers(0, frames - t + 1)
                block = np.ones((frames, H, W), np.int32)
                block[start:start + t, top:top + h, left:left + w] = 0
                if ctx_frames < frames:
                    block[ctx_frames:] = 0
                mask_e *= block
            flat = mask_e.ravel()
            p, e = np.flatnonzero(flat == 0), np.flatnonzero(flat)
            if len(e):
                break
        enc.append(e)
        pred.append(p)
    if not truncate:
        return enc, pred, (t, h, w)
    ke, kp = min(map(len, enc)), min(map(len, pred))
    return np.stack([m[:ke] for m in enc]), np.stack([m[:kp] for m in pred]), (t, h, w)


def vjepa_collate(rng, batch_size, frames=8, grid=(14, 14), pairs=((8, (0.15, 0.15)), (2, (0.7, 0.7))),
                  truncate=True):
    return [vjepa_generator(rng, batch_size, frames, grid, n, scale, truncate=truncate) for n, scale in pairs]


def ks_statistic(a, b) -> float:
    """Two-sample Kolmogorov-Smirnov statistic sup |F_a - F_b|."""
    a, b = np.sort(np.asarray(a, float)), np.sort(np.asarray(b, float))
    values = np.concatenate([a, b])
    fa = np.searchsorted(a, values, side="right") / len(a)
    fb = np.searchsorted(b, values, side="right") / len(b)
    return float(np.max(np.abs(fa - fb)))


def ks_critical(n: int, m: int, alpha: float = 0.001) -> float:
    """The asymptotic two-sample KS critical value at level alpha."""
    c = math.sqrt(-0.5 * math.log(alpha / 2))
    return c * math.sqrt((n + m) / (n * m))
