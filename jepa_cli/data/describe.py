"""`jepa info`: describe anything this tool writes, by what its metadata says it is.

Each kind registers a describer lazily (module path), so describing a dataset never imports JAX.
A describer takes the path and its group attributes and returns a JSON-able dict.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from jepa_cli.data import buckets, store
from jepa_cli.data.urls import BucketPath, bucket_run_refusal, location
from jepa_cli.data.jsonvalues import json_value
from jepa_cli.errors import InputError

# jepa_kind -> "module:function" that describes an artifact of that kind (`jepa info`)
DESCRIBERS: dict[str, str] = {
    "dataset": "jepa_cli.data.describe:describe_dataset",
    "masks": "jepa_cli.masks.io:describe",
    "run": "jepa_cli.training.run:describe_run",
}

RUN_MARKER = "run.json"  # a training run directory holds this file (docs/formats.md)


def describe(path: str | Path) -> dict[str, Any]:
    """A JSON-able description of the dataset, mask file, embedding set or run at `path`."""
    path = location(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if isinstance(path, BucketPath) and buckets.read_object(path, RUN_MARKER) is not None:
        raise bucket_run_refusal(path)
    if isinstance(path, Path) and (path / RUN_MARKER).exists():
        kind, attrs = "run", {}
    else:
        attrs = store.read_attributes(path)
        kind = attrs.get("jepa_kind", "dataset")
    if kind not in DESCRIBERS:
        raise InputError(f"{path}: cannot describe a {kind!r} (known: {', '.join(sorted(DESCRIBERS))})")
    module_name, func_name = DESCRIBERS[kind].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    return json_value({"path": str(path), "kind": kind} | func(path, attrs))


LONGEST_LIST_SHOWN = 8  # a numeric list longer than this is summarised in the human output


def numbers_summary(values: list[Any]) -> str | None:
    """`64 values, mean 0.0123, range [-0.31, 0.402]` for a list of more than LONGEST_LIST_SHOWN numbers
    (a latent set's per-channel latent_shift / latent_scale), which printed in full fills a screen;
    None for any other value. A None in the list (json_value's stand-in for NaN) is counted apart."""
    if not isinstance(values, list) or len(values) <= LONGEST_LIST_SHOWN:
        return None
    if not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values):
        return None
    numbers = [float(v) for v in values if v is not None]
    if not numbers:
        return None
    text = (f"{len(values)} values, mean {sum(numbers) / len(numbers):.3g}, "
            f"range [{min(numbers):.3g}, {max(numbers):.3g}]")
    missing = len(values) - len(numbers)
    return text + (f", {missing} not finite" if missing else "")


def summarise_long_lists(value: Any) -> Any:
    """`value` with every long list of numbers or names inside it replaced by its summary, recursively:
    what `jepa info` prints for humans (`--json` keeps every value)."""
    if isinstance(value, dict):
        return {key: summarise_long_lists(item) for key, item in value.items()}
    if isinstance(value, list):
        summary = numbers_summary(value) or names_summary(value)
        return summary if summary is not None else [summarise_long_lists(item) for item in value]
    return value


def names_summary(values: list[Any]) -> str | None:
    """`120 names: alice, bob, carol, ...` for a list of more than LONGEST_LIST_SHOWN strings (a
    split's groups, skipped files); None for any other value."""
    if not isinstance(values, list) or len(values) <= LONGEST_LIST_SHOWN:
        return None
    if not all(isinstance(v, str) for v in values):
        return None
    return f"{len(values)} names: {', '.join(values[:3])}, ..."


def array_summary(path: Path) -> dict[str, Any]:
    """Shape, dtype and chunking of one zarr v3 array, from its metadata alone."""
    meta = store.read_metadata(path, "array")
    try:
        chunk = meta["chunk_grid"]["configuration"]["chunk_shape"]
        codecs = [c["name"] for c in meta.get("codecs", [])]
        return {"shape": meta["shape"], "dtype": meta["data_type"], "chunks": chunk, "codecs": codecs}
    except (KeyError, TypeError) as exc:
        raise InputError(f"{path / 'zarr.json'}: incomplete array metadata (no {exc}); {store.REWRITE}") from None


def describe_dataset(path: Path, attrs: dict[str, Any]) -> dict[str, Any]:
    """A dataset: its arrays, attributes, label histogram and bytes on disk."""
    import numpy as np

    if not (path / "inputs").exists():
        raise InputError(f"{path}: a dataset needs an 'inputs' array")
    out: dict[str, Any] = {
        "modality": attrs.get("modality"),
        "layout": attrs.get("layout"),
        "num_samples": None,
        "inputs": array_summary(path / "inputs"),
    }
    out["num_samples"] = out["inputs"]["shape"][0]
    class_names = attrs.get("class_names") or []
    if (path / "labels").exists():
        out["labels"] = array_summary(path / "labels")
        labels = store.read_array(path / "labels")
        if labels.size and (labels.dtype.kind not in "iu" or labels.min() < 0):  # docs/formats.md: int32 indices
            found = labels.dtype.name if labels.dtype.kind not in "iu" else f"label {int(labels.min())}"
            raise InputError(f"{path / 'labels'}: not class indices (int32 >= 0), found {found}; {store.REWRITE}")
        if class_names and labels.size and labels.max() >= len(class_names):
            raise InputError(f"{path / 'labels'}: label {int(labels.max())} but {len(class_names)} class_names; "
                             f"{store.REWRITE}")
        if class_names:
            out["label_histogram"] = dict(zip(class_names, np.bincount(labels, minlength=len(class_names)).tolist()))
        else:  # unnamed classes: the labels present, never a bin per integer up to the largest
            values, counts = np.unique(labels, return_counts=True)
            out["label_histogram"] = {str(v): int(c) for v, c in zip(values.tolist(), counts.tolist())}
    if attrs.get("modality") == "audio" and (path / "durations").exists():  # docs/formats.md, "Audio datasets"
        from jepa_cli.data.audio import duration_stats

        out["duration_seconds"] = duration_stats(store.read_array(path / "durations"))
    out["num_classes"] = len(class_names) if class_names else None
    out["class_names"] = class_names
    out["bytes_on_disk"] = store.disk_bytes(path)
    out["attributes"] = {k: v for k, v in attrs.items() if k not in ("class_names",)}
    return out
