"""A batch of masks drawn for `jepa mask`: dense, in the mask file's layout, with what describes them."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jepa_cli.masks.config import MaskConfig, config_parameters
from jepa_cli.masks.indexing import to_dense
from jepa_cli.masks.io import dense_layout
from jepa_cli.masks.sampler import sample
from jepa_cli.masks.stats import mask_stats


def draw_masks(config: MaskConfig, batch: int, seed: int) -> tuple[dict[str, Any], np.ndarray, np.ndarray,
                                                                   dict[str, Any]]:
    """`batch` masks of `config` drawn from PRNGKey(`seed`): their description (strategy, grid, the
    context and target slots K and T, the tokens each keeps), the dense bool context and targets in
    the mask file's layout (io.dense_layout), and their statistics (stats.mask_stats)."""
    maskset = sample(jax.random.PRNGKey(seed), config, batch)
    context, targets = to_dense(maskset, config.num_patches)
    context, targets = dense_layout(config, np.asarray(context), np.asarray(targets))
    summary = mask_stats(context, targets, config.grid, config.frames)
    description = {
        "strategy": config.strategy,
        "grid": list(config.grid),
        "frames": config.frames,
        "num_patches": config.num_patches,
        "batch": batch,
        "seed": seed,
        "context_slots": int(maskset.context_index.shape[-1]),
        "target_slots": int(maskset.target_index.shape[-1]),
        "parameters": {k: v for k, v in config_parameters(config).items() if k != "strategy"},
        "context_tokens": summary["context_tokens"],
        "target_tokens": summary["target_tokens"],
    }
    return description, context, targets, summary
