"""Summary figures of a batch of dense masks: token counts and per-position coverage (NumPy)."""

from __future__ import annotations

from typing import Any

import numpy as np


def grid_shape(grid: tuple[int, int] | list[int], frames: int | None) -> tuple[int, ...]:
    """The patch grid's shape: (H, W), or (frames, H, W) in 3D."""
    return (tuple(grid) if frames is None else (int(frames), *grid))  # type: ignore[return-value]


def _summary(counts: np.ndarray) -> dict[str, float]:
    counts = np.asarray(counts).ravel()
    if counts.size == 0:
        return {"mean": 0.0, "min": 0, "max": 0}
    return {"mean": float(counts.mean()), "min": int(counts.min()), "max": int(counts.max())}


def mask_stats(context: np.ndarray, targets: np.ndarray, grid, frames: int | None = None) -> dict[str, Any]:
    """Figures for dense masks as written to disk (context [B, N] or [B, P, N], targets [B, M, N]).

    - context_tokens: tokens kept per context (mean, min, max); per pair in 3D as well;
    - target_tokens: tokens per target block / set (mean, min, max), and per target row;
    - context_coverage / target_coverage: for each grid position, the fraction of contexts (and of
      target sets) holding it, shaped like the grid;
    - official_cut: the batch-minimum context count the official collator would keep per sample.
    """
    context = np.asarray(context, bool)
    targets = np.asarray(targets, bool)
    if context.ndim == 2:
        context = context[:, None, :]
    shape = grid_shape(grid, frames)
    ctx_counts = context.sum(-1)  # [B, C]
    tgt_counts = targets.sum(-1)  # [B, M]
    out: dict[str, Any] = {
        "samples": int(context.shape[0]),
        "num_patches": int(context.shape[-1]),
        "context_tokens": _summary(ctx_counts),
        "target_tokens": _summary(tgt_counts),
        "target_tokens_per_row": [_summary(tgt_counts[:, m]) for m in range(tgt_counts.shape[1])],
        "official_cut": [int(ctx_counts[:, c].min()) if len(ctx_counts) else 0 for c in range(ctx_counts.shape[1])],
        "context_coverage": context.mean(axis=(0, 1)).reshape(shape).round(4).tolist() if len(context) else [],
        "target_coverage": targets.mean(axis=(0, 1)).reshape(shape).round(4).tolist() if len(targets) else [],
        "any_target_coverage": targets.any(1).mean(0).reshape(shape).round(4).tolist() if len(targets) else [],
    }
    if context.shape[1] > 1:
        out["context_tokens_per_pair"] = [_summary(ctx_counts[:, c]) for c in range(ctx_counts.shape[1])]
    return out
