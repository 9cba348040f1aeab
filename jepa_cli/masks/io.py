"""The mask file: a zarr v3 group of dense bool arrays (docs/formats.md, "Mask files")."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jepa_cli.data import atomic, store
from jepa_cli.data.describe import array_summary
from jepa_cli.data.urls import BucketPath, location
from jepa_cli.errors import InputError
from jepa_cli.masks.config import MaskConfig, MultiBlock3DConfig, config_parameters
from jepa_cli.masks.stats import mask_stats

KIND = "masks"
FORMAT_VERSION = 1


def dense_layout(config: MaskConfig, context: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """to_dense output ([B, C, N], [B, M, N]) -> the on-disk layout of the strategy.

    multiblock: context [B, N], targets [B, M, N]; multiblock3d: context [B, P, N], targets [B, P, N];
    random: context [B, N], targets [B, 1, N].
    """
    context, targets = np.asarray(context, bool), np.asarray(targets, bool)
    if not isinstance(config, MultiBlock3DConfig):
        context = context[:, 0, :]
    return context, targets


def attributes(config: MaskConfig, seed: int, batch: int) -> dict[str, Any]:
    params = config_parameters(config)
    return store.base_attributes(
        KIND,
        format_version=FORMAT_VERSION,
        strategy=config.strategy,
        grid=list(config.grid),
        frames=config.frames,
        num_patches=config.num_patches,
        batch=int(batch),
        seed=int(seed),
        parameters={k: v for k, v in params.items() if k != "strategy"},
    )


def write_masks(path: str | os.PathLike, config: MaskConfig, context: np.ndarray, targets: np.ndarray,
                seed: int, force: bool = False, log: Callable[[str], None] | None = None) -> Path | BucketPath:
    """Writes dense masks (on-disk layout) and their attributes atomically; returns the path.

    `force` replaces only an existing mask file; `log` receives notes (stale partials removed)."""
    with atomic.atomic_directory(path, force, KIND, log=log) as tmp:
        store.write_group(tmp, attributes(config, seed, context.shape[0]))
        store.write_array(tmp / "context", np.asarray(context, bool))
        store.write_array(tmp / "targets", np.asarray(targets, bool))
    return location(path)


def read_masks(path: str | os.PathLike) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """(attributes, context, targets) of a mask file; InputError if `path` is not one, or if its
    attributes and arrays disagree (a damaged or hand-edited file)."""
    path = location(path)
    attrs = store.read_attributes(path)
    if attrs.get("jepa_kind") != KIND:
        raise InputError(f"{path}: not a mask file (jepa_kind is {attrs.get('jepa_kind')!r})")
    shape = _grid_shape(path, attrs)
    context, targets = store.read_array(path / "context"), store.read_array(path / "targets")
    _check_layout(path, context, targets, int(np.prod(shape)))
    return attrs, context, targets


def _grid_shape(path: Path, attrs: dict[str, Any]) -> tuple[int, ...]:
    """The patch grid the attributes promise, (H, W) or (frames, H, W); InputError if malformed."""
    grid, frames = attrs.get("grid"), attrs.get("frames")
    dims = list(grid) if isinstance(grid, list) else None
    if frames is not None:
        dims = None if dims is None else [frames, *dims]
    valid = (dims is not None and len(dims) == (2 if frames is None else 3)
             and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims))
    if not valid:
        raise InputError(f"{path}/zarr.json: damaged mask file attributes (grid {grid!r}, frames {frames!r}); "
                         "rewrite it with jepa mask -o")
    return tuple(dims)  # type: ignore[arg-type]


def _check_layout(path: Path, context: np.ndarray, targets: np.ndarray, num_patches: int) -> None:
    """context [B, N] or [B, P, N] and targets [B, M, N] of bool, with N the grid's patches."""
    ok = (context.dtype == bool and targets.dtype == bool and context.ndim in (2, 3) and targets.ndim == 3
          and context.shape[0] == targets.shape[0] and context.shape[-1] == targets.shape[-1] == num_patches)
    if not ok:
        raise InputError(f"{path}: context {context.dtype}{list(context.shape)} and targets "
                         f"{targets.dtype}{list(targets.shape)} do not fit a grid of {num_patches} patches; "
                         "rewrite it with jepa mask -o")


def describe(path: Path, attrs: dict[str, Any]) -> dict[str, Any]:
    """`jepa info` for a mask file: strategy, grid, parameters, arrays and token counts."""
    attrs, context, targets = read_masks(path)
    stats = mask_stats(context, targets, attrs["grid"], attrs.get("frames"))
    return {
        "strategy": attrs.get("strategy"),
        "grid": attrs.get("grid"),
        "frames": attrs.get("frames"),
        "num_patches": attrs.get("num_patches"),
        "batch": attrs.get("batch"),
        "seed": attrs.get("seed"),
        "parameters": attrs.get("parameters"),
        "context": array_summary(path / "context"),
        "targets": array_summary(path / "targets"),
        "context_tokens": stats["context_tokens"],
        "target_tokens": stats["target_tokens"],
        "bytes_on_disk": store.disk_bytes(path),
        "jepa_version": attrs.get("jepa_version"),
    }
