"""Checks that a mask config can be sampled, each failure one line naming the option at fault
(docs/masks.md, "Limits")."""

from __future__ import annotations

import dataclasses
import math

from jepa_cli.errors import InputError
from jepa_cli.masks.config import (MAX_BLOCKS, MAX_MASK_CELLS, MAX_PATCHES, MaskConfig, MultiBlock3DConfig,
                                   MultiBlockConfig, RandomConfig)
from jepa_cli.masks.sizes import (multiblock3d_sizes, multiblock_context_sizes, multiblock_target_sizes,
                                  num_contexts, num_targets)

def validate(config: MaskConfig) -> MaskConfig:
    """Raises InputError (one line) when `config` cannot be sampled; returns it otherwise."""
    H, W = config.grid
    if H < 1 or W < 1:
        raise InputError(f"--grid: expected a positive HxW, got {H}x{W}")
    collator_batch = getattr(config, "collator_batch", None)
    if collator_batch is not None and not (isinstance(collator_batch, int) and collator_batch >= 1):
        raise InputError(f"--collator-batch: expected a positive number of samples, got {collator_batch!r}")
    _check_size(config)
    if isinstance(config, MultiBlockConfig):
        _check_range("--pred-scale", config.pred_scale)
        _check_range("--enc-scale", config.enc_scale)
        _check_range("--aspect", config.aspect, upper=None)
        _check_range("--enc-aspect", config.enc_aspect, upper=None)
        if not 1 <= config.npred <= MAX_BLOCKS:
            raise InputError(f"--npred must lie in 1..{MAX_BLOCKS} (target blocks per sample), got {config.npred}")
        if config.min_keep < 0:
            raise InputError(f"--min-keep must be >= 0, got {config.min_keep}")
        if H < 2 or W < 2:
            raise InputError(f"--grid {H}x{W}: multiblock needs at least 2x2 (blocks stay below the grid size)")
        # min_keep bounds the context (the official resampling loop); a target block only has to be
        # non-empty (the official loop would spin forever on a target block <= min_keep: we keep it)
        smallest_target = min(h * w for h, w in multiblock_target_sizes(config))
        if smallest_target < 1:
            raise InputError(
                f"--grid {H}x{W} cannot hold the target blocks: a block at --pred-scale {_fmt(config.pred_scale)} "
                "can be empty")
        smallest_context = min(h * w for h, w in multiblock_context_sizes(config))
        if smallest_context <= config.min_keep:
            raise InputError(
                f"--grid {H}x{W} cannot hold the context block: a block at --enc-scale {_fmt(config.enc_scale)} "
                f"can have {smallest_context} patches, not more than --min-keep {config.min_keep}")
    elif isinstance(config, MultiBlock3DConfig):
        P = config.pairs
        if P < 1 or any(n < 1 for n in config.npred):
            raise InputError(f"--npred: expected one positive block count per mask pair, got {_fmt(config.npred)}")
        if sum(config.npred) > MAX_BLOCKS:
            raise InputError(f"--npred {_fmt(config.npred)}: at most {MAX_BLOCKS} blocks per sample over all mask "
                             f"pairs, got {sum(config.npred)}")
        for name, values in (("--pred-scale", config.pred_scale), ("--temporal-scale", config.temporal_scale),
                             ("--max-temporal-keep", config.max_temporal_keep)):
            if len(values) != P:
                raise InputError(f"{name}: expected {P} entries (one per mask pair, as --npred), got {len(values)}")
        for p in range(P):
            _check_range("--pred-scale", config.pred_scale[p])
            _check_range("--temporal-scale", config.temporal_scale[p])
            _check_range("--max-temporal-keep", (config.max_temporal_keep[p],) * 2)
        _check_range("--aspect", config.aspect, upper=None)
        for p in range(P):
            ts, hws = multiblock3d_sizes(config, p)
            if min(h * w for h, w in hws) < 1:
                raise InputError(f"--grid {H}x{W} is too small for --pred-scale {_fmt(config.pred_scale[p])}: "
                                 "a block can be empty")
            if min(ts) >= config.frames and min(hws) == (H, W) and all(hw == (H, W) for hw in hws):
                raise InputError(f"mask pair {p + 1}: every block covers the whole {config.frames}x{H}x{W} grid, "
                                 "so the context is always empty")
    elif isinstance(config, RandomConfig):
        _check_range("--ratio", config.ratio)
        n = config.num_patches
        if int(n * (1 - config.ratio[1])) < 1:
            raise InputError(f"--grid {H}x{W} with --ratio {_fmt(config.ratio)} can leave an empty context")
        if int(n * (1 - config.ratio[0])) >= n:
            raise InputError(f"--grid {H}x{W} with --ratio {_fmt(config.ratio)} can leave an empty target set")
    return config


def validate_patch_grid(config: MaskConfig, patch_size: int) -> MaskConfig:
    """validate(config) for a grid of `patch_size`-pixel square patches that tile the images exactly
    (images of grid x patch_size pixels).

    An objective derives the grid from its model, so a user who never gave --grid learns from the
    error what made it too small (the image and patch sizes) and the largest smaller --patch-size
    that divides the images and gives a grid the masks fit."""
    try:
        return validate(config)
    except InputError as error:
        H, W = config.grid
        h, w = H * patch_size, W * patch_size
        q = next((q for q in range(patch_size - 1, 0, -1) if h % q == 0 and w % q == 0
                  and _fits(dataclasses.replace(config, grid=(h // q, w // q)))), None)
        if q is None:
            raise
        reason = str(error).removeprefix(f"--grid {H}x{W}").lstrip(": ").removeprefix("is ")
        raise InputError(f"{h}x{w} images in {patch_size}x{patch_size} patches (--patch-size {patch_size}) make "
                         f"a {H}x{W} token grid, too small for the masks ({reason}); a smaller patch gives a "
                         f"larger grid: --patch-size {q} makes {h // q}x{w // q}") from None


def _fits(config: MaskConfig) -> bool:
    """Whether validate(config) passes."""
    try:
        validate(config)
    except InputError:
        return False
    return True


def _grid_text(config: MaskConfig) -> str:
    """The options that set the grid, as given: '--grid 14x14' or '--frames 8 --grid 14x14'."""
    grid = "--grid {}x{}".format(*config.grid)
    return grid if config.frames is None else f"--frames {config.frames} {grid}"


def _check_size(config: MaskConfig) -> None:
    """The grid within MAX_PATCHES and `context_size` within the grid; checked before anything that
    enumerates the grid, so an absurd size is refused at once."""
    if config.frames is not None and config.frames < 1:
        raise InputError(f"--frames must be at least 1, got {config.frames}")
    n = config.num_patches
    if n > MAX_PATCHES:
        raise InputError(f"{_grid_text(config)} has {n} patches, over the limit of {MAX_PATCHES} per sample "
                         "(the time and memory of sampling grow with the grid; docs/masks.md, \"Limits\")")
    if config.context_size is not None and not 1 <= config.context_size <= n:
        raise InputError(f"--context-size {config.context_size} must lie in 1..{n}, the patches of "
                         f"{_grid_text(config)}")


def check_batch(config: MaskConfig, batch_size: int) -> None:
    """Raises InputError when `batch_size` masks of `config` exceed MAX_MASK_CELLS dense cells."""
    rows = num_contexts(config) + num_targets(config)
    cells = batch_size * rows * config.num_patches
    if batch_size < 1 or cells > MAX_MASK_CELLS:
        most = max(1, MAX_MASK_CELLS // (rows * config.num_patches))
        raise InputError(f"--batch-size {batch_size}: must lie in 1..{most} for {rows} mask rows of "
                         f"{config.num_patches} patches (at most {MAX_MASK_CELLS} mask cells, about 2 GB of memory)")


def _fmt(values) -> str:
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def _check_range(name: str, values: tuple[float, float], upper: float | None = 1.0) -> None:
    lo, hi = values
    if not all(math.isfinite(v) for v in values):
        raise InputError(f"{name}: expected finite numbers, got {_fmt(values)}")
    if lo > hi:
        raise InputError(f"{name}: inverted range {_fmt(values)} (expected low,high with low <= high)")
    if upper is not None and not (0 < lo and hi <= upper):
        raise InputError(f"{name}: values must lie in (0, 1], got {_fmt(values)}")
    if upper is None and not (1 / MAX_PATCHES <= lo and hi <= MAX_PATCHES):
        # no block on the largest grid is more than MAX_PATCHES times longer than wide
        raise InputError(f"{name}: values must lie in [1/{MAX_PATCHES}, {MAX_PATCHES}], got {_fmt(values)}")

