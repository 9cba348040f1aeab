"""The first samples of a dataset as RGB pictures, for the PNGs that show them (`jepa info --png`,
`jepa mask --png --data`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jepa_cli.data import store
from jepa_cli.errors import InputError


def preview_images(data: str, samples: int):
    """The first `samples` inputs of a dataset as uint8 [n, (T,) H, W, 3]."""
    path = Path(data)
    attrs = store.read_attributes(path)
    if attrs.get("jepa_kind", "dataset") != "dataset" or not (path / "inputs").exists():
        raise InputError(f"{path}: not a dataset (no 'inputs' array)")
    arr = store.open_array(path / "inputs")
    n = min(samples, arr.shape[0])
    x = np.asarray(store.read(arr, slice(0, n)))  # a damaged chunk is one clear error
    layout = str(attrs.get("layout") or "").upper()
    if x.ndim == 3:  # N H W
        x = x[..., None]
    if x.ndim == 4 and layout.startswith("NC") or (x.ndim == 4 and x.shape[1] in (1, 3) and x.shape[-1] not in (1, 3)):
        x = np.moveaxis(x, 1, -1)
    if x.ndim not in (4, 5) or x.shape[-1] not in (1, 3):
        raise InputError(f"{path}: cannot draw inputs of shape {list(x.shape)} (expected images N,H,W,C)")
    if x.dtype != np.uint8:
        lo, hi = float(x.min()), float(x.max())
        x = ((x - lo) / (hi - lo + 1e-12) * 255).astype(np.uint8)
    if x.shape[-1] == 1:
        x = np.repeat(x, 3, axis=-1)
    return x
