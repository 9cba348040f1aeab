"""The strategy configs and their static sizes (docs/masks.md).

Configs are frozen dataclasses: hashable, so they are static arguments of `jax.jit`. Their defaults
are the official recipes' values; each line cites where the value comes from. Each field is an
option declared once (jepa_cli/options.py): `jepa mask` and `jepa train` build their flags from it,
so this module imports JAX only where it samples (context_slots).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Union

from jepa_cli.errors import InputError
from jepa_cli.options import option

# How many failed context draws the official I-JEPA sampler allows before it drops one more target
# complement from the context's constraint (facebookresearch/ijepa src/masks/multiblock.py: timeout 20).
CONTEXT_RETRY_TIMEOUT = 20
# Draws V-JEPA's "empty context, resample" loop may take (the official loop is unbounded); after as
# many empty draws the last one is kept (a context with no valid slot). Default configs never get there.
MAX_EMPTY_CONTEXT_RETRIES = 8

# Limits that keep every mask command bounded in time and memory (docs/masks.md, "Limits"). Deriving K
# samples 32 probe batches of 128 over the whole grid, so the grid bounds the work even at --batch-size 1:
# the largest allowed 3D grid (8x32x32) takes about 45 s and 6.6 GB on 2 CPU cores, 2D grids less.
# Every official grid (at most 8x24x24 = 4,608 patches, V-JEPA ViT-H/16 at 384) fits.
MAX_PATCHES = 8192
# Target blocks per sample (--npred; summed over the mask pairs in 3D): each block is a pass over the
# grid in the sampler and a row of the target array. The official recipes use 4 and 8 + 2.
MAX_BLOCKS = 64
# Dense mask cells a batch may hold, batch x (contexts + targets) x patches: 2^27 cells take about 20 s
# and 2 GB of memory on 2 CPU cores (14x14, 4 targets, --batch-size 131,072).
MAX_MASK_CELLS = 2**27


@dataclass(frozen=True)
class MultiBlockConfig:
    """I-JEPA multi-block masks (facebookresearch/ijepa src/masks/multiblock.py)."""

    strategy: ClassVar[str] = "multiblock"
    # ijepa configs/in1k_vith14_ep300.yaml: crop 224 / patch 14
    grid: tuple[int, int] = option((16, 16), "Patch grid HxW (an objective takes it from its model).")
    # in1k_vith14_ep300.yaml mask.num_pred_masks
    npred: int = option(4, "Target blocks per image.", flag=True)
    # in1k_vith14_ep300.yaml mask.pred_mask_scale
    pred_scale: tuple[float, float] = option((0.15, 0.2), "Target block scale LO,HI (fraction of the grid).",
                                             flag=True)
    # in1k_vith14_ep300.yaml mask.aspect_ratio
    aspect: tuple[float, float] = option((0.75, 1.5), "Target block aspect ratio LO,HI (height / width).", flag=True)
    # in1k_vith14_ep300.yaml mask.enc_mask_scale
    enc_scale: tuple[float, float] = option((0.85, 1.0), "Context block scale LO,HI.", flag=True)
    # ijepa src/masks/multiblock.py: context aspect fixed (1., 1.)
    enc_aspect: tuple[float, float] = option((1.0, 1.0), "Context block aspect ratio LO,HI.")
    # in1k_vith14_ep300.yaml mask.min_keep
    min_keep: int = option(10, "A context keeps more than this many patches.", flag=True)
    # in1k_vith14_ep300.yaml mask.allow_overlap
    allow_overlap: bool = option(False, "Let the context overlap the targets.", flag=True)
    # docs/masks.md; the official collator cuts to the batch minimum instead
    context_size: int | None = option(None, "Context slots K per sample (default: derived, docs/masks.md).",
                                      flag=True)
    # ijepa issue #60: top/left = randint(0, H - h), exclusive
    official_positions: bool = option(False, "Block positions as the official code draws them (the last row "
                                      "and column are never reached).", flag=True)
    official_truncation: bool = option(False, "Cut contexts to the batch-minimum count (per mask pair in 3D), "
                                       "lowest indices kept, as the official collator.", flag=True)
    collator_batch: int | None = option(None, "With official_truncation: cut over groups of this many samples "
                                        "(the official per-GPU batch; default: the whole batch).", flag=True)

    @property
    def frames(self) -> None:
        return None

    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]


@dataclass(frozen=True)
class MultiBlock3DConfig:
    """V-JEPA 3D multi-block masks (facebookresearch/jepa src/masks/multiblock3d.py); one entry per mask pair."""

    strategy: ClassVar[str] = "multiblock3d"
    # jepa configs/pretrain/vitl16.yaml: crop 224 / patch 16
    grid: tuple[int, int] = option((14, 14), "Patch grid HxW (an objective takes it from its model).")
    # vitl16.yaml: num_frames 16 / tubelet_size 2
    frames: int = option(8, "Temporal grid size (an objective takes it from its model).")
    # vitl16.yaml mask: num_blocks 8 (short-range), 2 (long-range)
    npred: tuple[int, ...] = option((8, 2), "Target blocks per mask pair, e.g. 8,2.")
    # vitl16.yaml mask spatial_scale
    pred_scale: tuple[tuple[float, float], ...] = option(((0.15, 0.15), (0.7, 0.7)),
                                                         "Target block scale per pair, e.g. 0.15,0.7 or 0.1:0.2,0.7.")
    # vitl16.yaml mask temporal_scale
    temporal_scale: tuple[tuple[float, float], ...] = option(((1.0, 1.0), (1.0, 1.0)),
                                                             "Temporal block scale per pair.")
    # vitl16.yaml mask aspect_ratio (both pairs)
    aspect: tuple[float, float] = option((0.75, 1.5), "Target block aspect ratio LO,HI (height / width).")
    # vitl16.yaml mask max_temporal_keep
    max_temporal_keep: tuple[float, ...] = option((1.0, 1.0), "Fraction of frames the context may span, per pair.")
    # docs/masks.md; the official collator cuts to the batch minimum instead
    context_size: int | None = option(None, "Context slots K per sample (default: derived, docs/masks.md).")
    # no-op: multiblock3d.py already draws randint(0, H - h + 1)
    official_positions: bool = option(False, "No effect: the official 3D sampler has no position quirk.")
    official_truncation: bool = option(False, "Cut contexts to the batch-minimum count (per mask pair in 3D), "
                                       "lowest indices kept, as the official collator.")
    collator_batch: int | None = option(None, "With official_truncation: cut over groups of this many samples "
                                        "(the official per-GPU batch; default: the whole batch).")

    @property
    def num_patches(self) -> int:
        return self.frames * self.grid[0] * self.grid[1]

    @property
    def pairs(self) -> int:
        return len(self.npred)


@dataclass(frozen=True)
class RandomConfig:
    """Audio-JEPA `random_block` masks (LudovicTuncay/Audio-JEPA src/models/jepa_module.py)."""

    strategy: ClassVar[str] = "random"
    # Audio-JEPA: 256 frames x 128 mel / patch 16 -> 16 x 8
    grid: tuple[int, int] = option((16, 8), "Patch grid HxW (an objective takes it from its model).")
    # Audio-JEPA jepa_module.py: mask ratio ~ U(0.4, 0.6) per batch
    ratio: tuple[float, float] = option((0.4, 0.6), "Masking ratio range LO,HI, drawn once per batch.")
    context_size: int | None = option(None, "Context slots K per sample (default: derived, docs/masks.md).")
    official_positions: bool = option(False, "No effect: a permutation has no positional quirk.")
    official_truncation: bool = option(False, "No effect: all contexts of a batch have the same size.")

    @property
    def frames(self) -> None:
        return None

    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]


MaskConfig = Union[MultiBlockConfig, MultiBlock3DConfig, RandomConfig]
CONFIGS: dict[str, type] = {c.strategy: c for c in (MultiBlockConfig, MultiBlock3DConfig, RandomConfig)}


def config_parameters(config: MaskConfig) -> dict[str, Any]:
    """Every field of `config` as JSON-able values (tuples become lists), plus the strategy."""
    out: dict[str, Any] = {"strategy": config.strategy}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        out[f.name] = _jsonable(value)
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


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


DERIVE_BATCHES, DERIVE_BATCH_SIZE, DERIVE_QUANTILE = 32, 128, 90


@functools.lru_cache(maxsize=None)
def context_slots(config: MaskConfig, batch_size: int | None = None) -> int:
    """K: `context_size`, or the derived default (docs/masks.md).

    Default mode: K is the 90th percentile of the official collator's batch-minimum context count at
    batch 128, estimated from 32 batches drawn with this config and PRNGKey(0), so that at least 9
    batches in 10 keep as many tokens per sample as the official cut would.
    Official truncation: K is the largest batch minimum seen over those probe batches drawn at the
    actual `batch_size`, so the static shapes cost about the official work and the cut fits K in
    all but rare batches (which then keep their K lowest indices).
    """
    if config.context_size is not None:
        return int(config.context_size)
    upper = max_context_count(config)
    if isinstance(config, RandomConfig):
        return upper  # every context of a batch has the same length: nothing to cut
    import jax
    import numpy as np

    from jepa_cli.masks.sampler import sample_many

    probe_batch = DERIVE_BATCH_SIZE
    if config.official_truncation and batch_size:  # the cut runs over one group: probe at its size
        probe_batch = min(batch_size, config.collator_batch or batch_size)
    probe = dataclasses.replace(config, context_size=upper, official_truncation=True, collator_batch=None)
    # One compiled program, run at once: concrete even when K is asked for while a training step is
    # being traced. (Under jax.ensure_compile_time_eval a jitted function runs op by op: about 70
    # one-operation compiles for a tiny model.)
    draw = jax.jit(lambda: sample_many(jax.random.PRNGKey(0), probe, probe_batch, DERIVE_BATCHES).context_valid)
    valid = draw.lower().compile()()
    # official cut per batch and context (pair); K must serve the largest pair
    mins = np.asarray(valid).sum(-1).min(axis=1).max(axis=-1)
    quantile = 100 if config.official_truncation else DERIVE_QUANTILE
    return max(1, int(np.percentile(mins, quantile, method="higher")))


# ---------------------------------------------------------------------------------------------
# Validation and construction from CLI options


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


def config_from_options(strategy: str, **options: Any) -> MaskConfig:
    """A validated config for `strategy` from keyword options; None values keep the defaults.

    Options: the fields of the strategy's config (MultiBlockConfig, MultiBlock3DConfig, RandomConfig),
    as values or as command-line text ('0.15,0.2'). For multiblock3d, npred / pred_scale /
    temporal_scale / max_temporal_keep hold one entry per mask pair (a scale entry is a number or a
    (low, high) pair).
    """
    if strategy not in CONFIGS:
        raise InputError(f"--strategy: unknown strategy {strategy!r} (choose from {', '.join(CONFIGS)})")
    given = {k: v for k, v in options.items() if v is not None}
    if "frames" in given and strategy != "multiblock3d":
        raise InputError(f"--frames is for 3D masks (multiblock3d), not --strategy {strategy}")
    unknown = set(given) - {f.name for f in dataclasses.fields(CONFIGS[strategy])}
    if unknown:
        names = ", ".join("--" + u.replace("_", "-") for u in sorted(unknown))
        raise InputError(f"{names}: not an option of --strategy {strategy}")
    if "grid" in given:
        grid = tuple(_number("grid", v, int) for v in _as_tuple(given["grid"]))
        if len(grid) != 2 or min(grid) < 1:
            raise InputError(f"--grid: expected a positive HxW, got {given['grid']!r}")
        given["grid"] = grid
    cls = CONFIGS[strategy]
    if strategy == "multiblock3d":
        if "npred" in given:
            given["npred"] = tuple(_number("npred", n, int) for n in _as_tuple(given["npred"]))
        pairs = len(given.get("npred", cls.npred))
        for name in ("pred_scale", "temporal_scale"):
            if name in given:
                given[name] = _per_pair_ranges(name, given[name], pairs)
            elif pairs != len(getattr(cls, name)):
                given[name] = (getattr(cls, name)[0],) * pairs if name == "temporal_scale" else None
        if given.get("pred_scale", True) is None:
            raise InputError(f"--pred-scale: give one scale per mask pair ({pairs} pairs from --npred)")
        if "max_temporal_keep" in given:
            given["max_temporal_keep"] = tuple(_number("max_temporal_keep", v, float)
                                               for v in _as_tuple(given["max_temporal_keep"]))
            if len(given["max_temporal_keep"]) == 1:
                given["max_temporal_keep"] *= pairs
        elif pairs != len(cls.max_temporal_keep):
            given["max_temporal_keep"] = (1.0,) * pairs
    for name in ("pred_scale", "aspect", "enc_scale", "enc_aspect", "ratio"):
        if name in given and not (strategy == "multiblock3d" and name == "pred_scale"):
            given[name] = _range(name, given[name])
    for name in ("npred", "min_keep", "context_size", "frames"):
        if name in given and not isinstance(given[name], tuple):
            given[name] = _number(name, given[name], int)
    return validate(cls(**given))


def _number(name: str, value: Any, kind: type) -> Any:
    """int(value) or float(value), else InputError naming the option (a recipe may hold a wrong type)."""
    exact = not isinstance(value, bool) and not (kind is int and isinstance(value, float) and not value.is_integer())
    if exact:
        try:
            return kind(value)
        except (TypeError, ValueError, OverflowError):
            pass
    expected = "an integer" if kind is int else "a number"
    raise InputError(f"--{name.replace('_', '-')}: expected {expected}, got {value!r}")


def _as_tuple(value: Any) -> tuple:
    if isinstance(value, str):
        return tuple(v for v in value.split(",") if v.strip())
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return (value,)


def _range(name: str, value: Any) -> tuple[float, float]:
    """'0.15,0.2', (0.15, 0.2) or a single number (a fixed value) -> (low, high)."""
    flag = "--" + name.replace("_", "-")
    try:
        parts = tuple(float(v) for v in _as_tuple(value))
    except (TypeError, ValueError):
        raise InputError(f"{flag}: expected low,high numbers, got {value!r}") from None
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2:
        raise InputError(f"{flag}: expected low,high (two numbers), got {value!r}")
    return parts  # type: ignore[return-value]


def _per_pair_ranges(name: str, value: Any, pairs: int) -> tuple[tuple[float, float], ...]:
    """'0.15,0.7' or '0.1:0.2,0.7' (one entry per pair, lo:hi for a range) -> ((lo, hi), ...)."""
    flag = "--" + name.replace("_", "-")
    items = _as_tuple(value)
    out = []
    for item in items:
        if isinstance(item, str):
            item = tuple(item.split(":"))
        try:
            parts = tuple(float(v) for v in (item if isinstance(item, (tuple, list)) else (item,)))
        except (TypeError, ValueError):
            raise InputError(f"{flag}: expected numbers or low:high ranges, got {value!r}") from None
        if len(parts) == 1:
            parts = parts * 2
        if len(parts) != 2:
            raise InputError(f"{flag}: expected a number or low:high per mask pair, got {value!r}")
        out.append(parts)
    if len(out) == 1 and pairs > 1:
        out = out * pairs
    if len(out) != pairs:
        raise InputError(f"{flag}: expected {pairs} entries (one per mask pair), got {len(out)}")
    return tuple(out)
