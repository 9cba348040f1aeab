"""Checks that a mask config can be sampled, each failure one line naming the option at fault
(docs/masks.md, "Limits")."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from jepa_cli.errors import InputError
from jepa_cli.masks.config import (MAX_BLOCKS, MAX_MASK_CELLS, MAX_PATCHES, MaskConfig, MultiBlock3DConfig,
                                   MultiBlockConfig, RandomConfig)
from jepa_cli.masks.sizes import (multiblock3d_sizes, multiblock_context_sizes, multiblock_target_sizes,
                                  num_contexts, num_targets)


class GridError(InputError):
    """A mask config whose token grid cannot hold its masks. `reason` says why without naming the grid
    (a phrase that follows "the grid ..."), so that an objective, which derives the grid from its
    model's options, can name those options instead (validate_token_grid)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


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
            raise GridError(f"--grid {H}x{W}: multiblock needs at least 2x2 (blocks stay below the grid size)",
                            "is below multiblock's 2x2 (blocks stay below the grid size)")
        # min_keep bounds the context (the official resampling loop); a target block only has to be
        # non-empty (the official loop would spin forever on a target block <= min_keep: we keep it)
        smallest_target = min(h * w for h, w in multiblock_target_sizes(config))
        if smallest_target < 1:
            reason = f"cannot hold the target blocks: a block at --pred-scale {_fmt(config.pred_scale)} can be empty"
            raise GridError(f"--grid {H}x{W} {reason}", reason)
        smallest_context = min(h * w for h, w in multiblock_context_sizes(config))
        if smallest_context <= config.min_keep:
            reason = (f"cannot hold the context block: a block at --enc-scale {_fmt(config.enc_scale)} can have "
                      f"{smallest_context} patches, not more than --min-keep {config.min_keep}")
            raise GridError(f"--grid {H}x{W} {reason}", reason)
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
                raise GridError(f"--grid {H}x{W} is too small for --pred-scale {_fmt(config.pred_scale[p])}: "
                                "a block can be empty", f"cannot hold the target blocks of mask pair {p + 1}: a "
                                f"block at --pred-scale {_fmt(config.pred_scale[p])} can be empty")
            if min(ts) >= config.frames and min(hws) == (H, W) and all(hw == (H, W) for hw in hws):
                raise GridError(f"mask pair {p + 1}: every block covers the whole {config.frames}x{H}x{W} grid, "
                                "so the context is always empty", f"leaves mask pair {p + 1} no context: every "
                                "block covers the whole grid")
    elif isinstance(config, RandomConfig):
        _check_range("--ratio", config.ratio)
        n = config.num_patches
        for empty, fails in (("context", int(n * (1 - config.ratio[1])) < 1),
                             ("target set", int(n * (1 - config.ratio[0])) >= n)):
            if fails:
                raise GridError(f"--grid {H}x{W} with --ratio {_fmt(config.ratio)} can leave an empty {empty}",
                                f"can leave an empty {empty} at --ratio {_fmt(config.ratio)}")
    return config


def validate_token_grid(make: Callable[[tuple[int, ...]], MaskConfig], config: Any, extent: tuple[int, ...],
                        patch: tuple[int, ...], noun: str, settings: tuple[str, ...]) -> MaskConfig:
    """make(grid), the validated mask config on the token grid of `extent` // `patch` tokens per axis
    (`extent`: the input's size per axis, such as (32, 32) pixels, (16, 32, 32) frames and pixels or
    (256, 128) spectrogram frames and mel bins; `patch`: one patch's, in the same order).

    An objective derives the grid from its model, so a user who never gave --grid learns from the
    error the options that made it: `settings`, the fields of the objective config `config` that set
    `extent` and `patch`, each named as the user sets it (its `jepa train` flag, else its recipe key);
    and, when the last two axes' patches are `config.patch_size` squares, the largest smaller
    --patch-size that divides the input and gives a grid the masks fit."""
    grid = tuple(e // p for e, p in zip(extent, patch))
    try:
        return make(grid)
    except GridError as error:
        named = ", ".join(filter(None, (_setting(config, name) for name in settings)))
        message = (f"{_dims(extent)} {noun} in {_dims(patch)} patches ({named}) make {_article(grid)} "
                   f"{_dims(grid)} token grid, which {error.reason}")
        size = getattr(config, "patch_size", None)
        if isinstance(size, int) and "patch_size" in settings and tuple(patch[-2:]) == (size, size):
            h, w = extent[-2:]
            q = next((q for q in range(size - 1, 0, -1) if h % q == 0 and w % q == 0
                      and _fits(make, grid[:-2] + (h // q, w // q))), None)
            if q is not None:
                message += (f"; a smaller patch gives a larger grid: --patch-size {q} makes "
                            f"{_dims(grid[:-2] + (h // q, w // q))}")
        raise InputError(message) from None


def _dims(values: tuple[int, ...]) -> str:
    return "x".join(map(str, values))


def _article(grid: tuple[int, ...]) -> str:
    """'an' before a size read aloud with a vowel sound (8x8, 11x11, 18x4), else 'a'."""
    first = str(grid[0])
    return "an" if first.startswith("8") or first in ("11", "18") else "a"


def _setting(config: Any, name: str) -> str | None:
    """`--patch-size 16` for a `jepa train` flag, `num_frames = 16` for a recipe key; None when unset."""
    value = getattr(config, name, None)
    if value is None:
        return None
    field = next((f for f in dataclasses.fields(config) if f.name == name), None)
    text = _dims(value) if isinstance(value, (tuple, list)) else str(value)
    if field is not None and field.metadata.get("flag"):
        return f"--{name.replace('_', '-')} {text}"
    return f"{name} = {text}"


def _fits(make: Callable[[tuple[int, ...]], MaskConfig], grid: tuple[int, ...]) -> bool:
    """Whether make(grid) passes its validation."""
    try:
        make(grid)
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
        reason = (f"has {n} patches, over the limit of {MAX_PATCHES} per sample (the time and memory of sampling "
                  "grow with the grid; docs/masks.md, \"Limits\")")
        raise GridError(f"{_grid_text(config)} {reason}", reason)
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

