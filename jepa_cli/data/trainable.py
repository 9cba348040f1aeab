"""What a dataset must be for `jepa train`: each modality's example on disk (EXAMPLE_RULES), the
checks of a dataset's metadata (`check_dataset`) and of its modality against the objective's
(`check_modality`). Reads JSON metadata only and imports no JAX, so a bad dataset is refused before
JAX loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jepa_cli.data import store
from jepa_cli.data.urls import location
from jepa_cli.errors import InputError

# What each modality's `inputs` array holds per example: (ranks of one example, dtypes, description).
# An objective names the modalities it trains on (`Objective.modalities`, default ("image",)).
EXAMPLE_RULES: dict[str, tuple[tuple[int, ...], tuple[str, ...], str]] = {
    "image": ((3,), ("uint8",), "[N,H,W,C] uint8 images"),
    "video": ((4,), ("uint8",), "[N,T,H,W,C] uint8 clips"),
    "audio": ((1,), ("float32", "int16"), "[N,samples] float32 or int16 waveforms"),
    "latent": ((1, 2), ("float32",), "[N,D] or [N,T,D] float32 latents"),
}


def check_dataset(path: str | Path) -> dict[str, Any]:
    """Validates a dataset directory for training, whatever its modality.

    Returns {num_samples, modality, shape (of one example), dtype, num_classes, attrs}, and for
    images also {height, width, channels}. The objective's modalities are checked by
    `check_modality`."""
    path = location(path)
    if not path.exists():
        raise InputError(f"{path}: no such dataset")
    attrs = store.read_attributes(path)
    kind = attrs.get("jepa_kind", "dataset")
    if kind != "dataset":
        raise InputError(f"{path}: is a {kind!r}, not a dataset")
    modality = attrs.get("modality", "image")
    if modality not in EXAMPLE_RULES:
        raise InputError(f"{path}: unknown modality {modality!r} (known: {', '.join(EXAMPLE_RULES)})")
    meta_path = path / "inputs" / "zarr.json"
    if not (path / "inputs").exists():
        raise InputError(f"{path}: a dataset needs an 'inputs' array")
    try:
        meta = store.read_metadata(path / "inputs", "array")
        shape, dtype = [int(n) for n in meta["shape"]], meta["data_type"]
    except (OSError, ValueError, TypeError, KeyError, InputError):
        raise InputError(f"{meta_path}: damaged array metadata (not zarr v3 JSON with a shape and data_type); "
                         "ingest the dataset again") from None
    ranks, dtypes, what = EXAMPLE_RULES[modality]
    if len(shape) - 1 not in ranks:
        raise InputError(f"{path}: modality {modality!r} needs inputs {what}, got shape {shape}")
    if dtype not in dtypes:
        raise InputError(f"{path}: modality {modality!r} needs inputs {what}, got {dtype}")
    if shape[0] == 0:
        raise InputError(f"{path}: the dataset is empty")
    info = {"num_samples": shape[0], "modality": modality, "shape": shape[1:], "dtype": dtype,
            "num_classes": len(attrs.get("class_names") or []), "attrs": attrs}
    if modality == "image":
        info.update(height=shape[1], width=shape[2], channels=shape[3])
    return info


def check_modality(path: str | Path, ds: dict[str, Any], objective: Any, name: str) -> None:
    """InputError unless the objective trains on the dataset's modality (and has its labels if it
    needs them)."""
    modalities = tuple(getattr(objective, "modalities", ("image",)))
    if ds["modality"] not in modalities:
        raise InputError(f"{path}: modality is {ds['modality']!r}, objective {name!r} trains on "
                         f"{' or '.join(repr(m) for m in modalities)}")
    if getattr(objective, "uses_labels", False) and not (location(path) / "labels").exists():
        raise InputError(f"{path}: has no labels, which objective {name!r} needs")
