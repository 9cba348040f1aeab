"""Features for the probes: a dataset's `inputs` as float32 arrays, with labels, checked in pairs.

A latent dataset (modality "latent", e.g. from encode-latents) is used as is: `[N, D]` vectors or
`[N, T, D]` tokens. Any other dataset needs `raw=True`: samples are flattened and pixels (integer
dtypes) are scaled to [0, 1] by the dtype's maximum, the baseline every table needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from jepa_cli.data import store
from jepa_cli.errors import InputError


@dataclass
class Features:
    """One split: `x` float32 `[N, D]` or `[N, T, D]`, `labels` int32 `[N]`."""

    path: Path
    x: np.ndarray
    labels: np.ndarray
    class_names: list[str] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.x.shape[0])


def load_features(path: str | Path, raw: bool = False, tokens: bool = False) -> Features:
    """Loads a dataset's inputs and labels as probe features.

    `tokens=False` gives `[N, D]` (token sets `[N, T, D]` are mean-pooled over T);
    `tokens=True` gives `[N, T, D]` (vectors become one token; raw samples one token of all pixels).
    """
    path = Path(path)
    attrs = store.read_attributes(path)
    if attrs.get("jepa_kind", "dataset") != "dataset":
        raise InputError(f"{path}: is a {attrs.get('jepa_kind')!r}, not a dataset")
    if not (path / "inputs").exists():
        raise InputError(f"{path}: a dataset needs an 'inputs' array")
    if not (path / "labels").exists():
        raise InputError(f"{path}: has no labels; a probe needs a labelled dataset")
    modality = attrs.get("modality")
    if modality != "latent" and not raw:
        raise InputError(f"{path}: modality is {modality!r}, not 'latent' (encode it with "
                         "`jepa encode-latents`, or pass --raw to probe its raw values)")
    x = store.read_array(path / "inputs")
    labels = np.asarray(store.read_array(path / "labels")).astype(np.int32)
    if x.shape[0] != labels.shape[0]:
        raise InputError(f"{path}: inputs has {x.shape[0]} samples but labels has {labels.shape[0]}")
    if x.shape[0] == 0:
        raise InputError(f"{path}: the dataset is empty")
    if labels.min() < 0:
        raise InputError(f"{path}: labels must be non-negative class indices")
    if raw or modality != "latent":
        scale = float(np.iinfo(x.dtype).max) if np.issubdtype(x.dtype, np.integer) else 1.0
        x = x.reshape(x.shape[0], -1).astype(np.float32) / np.float32(scale)
        if tokens:
            x = x[:, None, :]
    else:
        x = np.asarray(x, dtype=np.float32)
        if x.ndim not in (2, 3):
            raise InputError(f"{path}: latent inputs must be [N, D] or [N, T, D], got shape {list(x.shape)}")
        if tokens and x.ndim == 2:
            x = x[:, None, :]
        elif not tokens and x.ndim == 3:
            x = x.mean(axis=1)
    if not np.all(np.isfinite(x)):
        raise InputError(f"{path}: inputs contain NaN or infinite values")
    return Features(path, x, labels, list(attrs.get("class_names") or []), attrs)


def load_pair(train: str | Path, test: str | Path, raw: bool = False, tokens: bool = False,
              min_train: int = 1) -> tuple[Features, Features, int]:
    """Loads TRAIN and TEST, checks they agree; returns them and the number of classes."""
    tr = load_features(train, raw, tokens)
    te = load_features(test, raw, tokens)
    if tr.x.shape[-1] != te.x.shape[-1]:
        raise InputError(f"feature dimensions differ: {tr.path} has {tr.x.shape[-1]}, "
                         f"{te.path} has {te.x.shape[-1]}")
    if tr.n < min_train:
        raise InputError(f"{tr.path}: {tr.n} training samples, fewer than k={min_train}")
    num_classes = int(max(tr.labels.max(), te.labels.max())) + 1
    num_classes = max(num_classes, len(tr.class_names))
    if len(np.unique(tr.labels)) < 2:
        raise InputError(f"{tr.path}: a probe needs at least two classes in TRAIN")
    return tr, te, num_classes


def per_class_accuracy(labels: np.ndarray, predictions: np.ndarray, num_classes: int,
                       class_names: list[str] | None = None) -> list[dict[str, Any]]:
    """Top-1 accuracy of each class present in `labels`."""
    rows = []
    for c in range(num_classes):
        sel = labels == c
        n = int(sel.sum())
        if n == 0:
            continue
        name = class_names[c] if class_names and c < len(class_names) else str(c)
        rows.append({"class": c, "name": name, "n": n, "top1": float((predictions[sel] == c).mean())})
    return rows


def topk_accuracy(labels: np.ndarray, ranked: np.ndarray) -> tuple[float, float]:
    """Top-1 and top-5 from class rankings `[N, >=1]` (best first); top-5 uses min(5, columns)."""
    hits = ranked[:, :5] == labels[:, None]
    return float(hits[:, 0].mean()), float(hits.any(axis=1).mean())
