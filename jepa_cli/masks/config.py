"""The strategy configs and their static sizes (docs/masks.md).

Configs are frozen dataclasses: hashable, so they are static arguments of `jax.jit`. Their defaults
are the official recipes' values; each line cites where the value comes from. Each field is an
option declared once (jepa_cli/options.py): `jepa mask` and `jepa train` build their flags from it,
so this module never imports JAX.

The static sizes the configs imply live in masks/sizes.py, their checks in masks/checks.py,
and building one from command-line text in masks/parse.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Union

from jepa_cli.data.jsonvalues import json_value
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
        out[f.name] = json_value(value)
    return out

