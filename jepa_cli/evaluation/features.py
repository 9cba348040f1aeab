"""Features for the probes: a dataset's `inputs` as float32 arrays, with labels, checked in pairs.

A latent dataset (modality "latent", e.g. from encode-latents) is used as is: `[N, D]` vectors or
`[N, T, D]` tokens. Any other dataset needs `raw=True`: samples are flattened and pixels (integer
dtypes) are scaled to [0, 1] by the dtype's maximum, the baseline every table needs; audio clips
become their log-mel spectrogram averaged over time (128 values, `data.log_mel.pooled_log_mel`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from jepa_cli.data import store
from jepa_cli.data.labels import int32_labels
from jepa_cli.data.urls import location
from jepa_cli.errors import InputError


@dataclass
class Features:
    """One split: `x` float32 `[N, D]` or `[N, T, D]`, `labels` int32 `[N]`."""

    path: Path
    x: np.ndarray
    labels: np.ndarray
    class_names: list[str] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)
    sample_shape: tuple[int, ...] = ()  # of one stored sample, before flattening or pooling

    @property
    def n(self) -> int:
        return int(self.x.shape[0])


def load_features(path: str | Path, raw: bool = False, tokens: bool = False, raw_pool: int = 1) -> Features:
    """Loads a dataset's inputs and labels as probe features.

    `tokens=False` gives `[N, D]` (token sets `[N, T, D]` are mean-pooled over T);
    `tokens=True` gives `[N, T, D]` (vectors become one token; raw samples one token of all pixels).
    `raw_pool` P: raw images and video frames averaged over P x P pixel blocks first (`pool_pixels`).
    """
    path = location(path)
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
    sample_shape = tuple(int(d) for d in x.shape[1:])
    labels = int32_labels(store.read_array(path / "labels"), str(path))
    if x.shape[0] != labels.shape[0]:
        raise InputError(f"{path}: inputs has {x.shape[0]} samples but labels has {labels.shape[0]}")
    if x.shape[0] == 0:
        raise InputError(f"{path}: the dataset is empty")
    if labels.min() < 0:
        raise InputError(f"{path}: labels must be non-negative class indices")
    if modality == "audio":  # raw audio: time-pooled log-mel features (data/log_mel.py, pooled_log_mel)
        from jepa_cli.data.log_mel import pooled_log_mel

        x = pooled_log_mel(x, int(attrs.get("sample_rate") or 0) or 16000)
        x = x[:, None, :] if tokens else x
    elif raw or modality != "latent":
        scale = float(np.iinfo(x.dtype).max) if np.issubdtype(x.dtype, np.integer) else 1.0
        x = pool_pixels(np.asarray(x, np.float32), raw_pool, path) if raw_pool > 1 else x
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
    return Features(path, x, labels, list(attrs.get("class_names") or []), attrs, sample_shape)


def pool_pixels(x: np.ndarray, size: int, path: str | Path) -> np.ndarray:
    """Images [N, H, W, C] or clips [N, T, H, W, C] averaged over `size` x `size` pixel blocks:
    [N, (T,) H / size, W / size, C]. InputError unless `size` divides H and W."""
    *lead, h, w, c = x.shape
    if len(lead) not in (1, 2) or h % size or w % size:
        raise InputError(f"{path}: --raw-pool {size} needs images or clips whose height and width it divides, got "
                         f"samples of shape {list(x.shape[1:])}")
    return x.reshape(*lead, h // size, size, w // size, size, c).mean(axis=(-4, -2))


# The next command for a refused pair: the objective that trains an encoder on a dataset's modality.
OBJECTIVE_OF_MODALITY = {"image": "ijepa", "audio": "audio-jepa", "video": "vjepa"}


def check_modality_pair(dataset: str | Path, modality: str, objective: Any, run: str | Path | None = None) -> None:
    """InputError naming both sides when `objective`'s encoder (of `run`, when given) does not take
    samples of `modality` (image, video, audio, latent), the modality of `dataset`, and the commands
    that make a matching pair: ingesting data of the encoder's modality, or training a run on the
    dataset's. Every command that hands a run's encoder a dataset (encode-latents, probe --run, fd
    --run, train --probe-data) checks the pair here first: the encoder's transform would otherwise
    fail on the sample's key."""
    modalities = tuple(getattr(objective, "modalities", ("image",)))
    if modality not in modalities:
        name = getattr(objective, "name", "?")
        encoder = f"{run} (objective {name!r})" if run is not None else f"objective {name!r}"
        wanted = " or ".join(modalities)
        hints = [f"{wanted} data ({ingest_command(wanted, getattr(objective, 'config', None))})"]
        if modality in OBJECTIVE_OF_MODALITY:
            hints.append(f"a run trained on {modality} data (jepa train --objective "
                         f"{OBJECTIVE_OF_MODALITY[modality]} --data {dataset} --out RUN)")
        raise InputError(f"{dataset} holds {modality} samples, but {encoder} encodes {wanted} samples: "
                         f"give {', or '.join(hints)}")


def ingest_command(modality: str, config: Any = None) -> str:
    """`jepa ingest FOLDER OUT.zarr ...` for data of `modality`, with the clip shape an encoder of
    objective config `config` was trained on (a video run's frames, an audio run's rate and length)."""
    folder = {"image": "IMAGE_FOLDER", "audio": "AUDIO_FOLDER", "video": "VIDEO_FOLDER"}.get(modality, "FOLDER")
    flags = {"video": (("--frames", "num_frames"),),
             "audio": (("--sample-rate", "sample_rate"), ("--seconds", "seconds"))}.get(modality, ())
    given = "".join(f" {flag} {getattr(config, key):g}" for flag, key in flags
                    if isinstance(getattr(config, key, None), (int, float)))
    return f"jepa ingest {folder} OUT.zarr{given}"


def encoder_of(attrs: dict[str, Any], raw: bool = False) -> dict[str, Any] | None:
    """What produced a set of features, from its `provenance` (docs/formats.md, embedding sets): the run,
    checkpoint step, weights (target or context), layers, pool, source dataset and, for a target
    encoder, the weight its random initialisation still holds in it (`init_weight`). None for raw
    inputs and for datasets that no encoder wrote."""
    provenance = attrs.get("provenance")
    if raw or not isinstance(provenance, dict) or "run" not in provenance:
        return None
    keys = ("run", "step", "weights", "layers", "pool", "source", "init_weight")
    return {key: provenance[key] for key in keys if key in provenance}


def encoding_mismatch(train_attrs: dict[str, Any], test_attrs: dict[str, Any], raw: bool = False) -> str | None:
    """How two sets' encodings differ (their `provenance` attributes apart from the source, and
    their class names), as one line; None when they match, so that a probe compares like with like.
    With `raw` only the class names count: the probe reads the stored values themselves, so what
    wrote them (an encoder, a sampler, nothing) does not change what is compared."""
    a, b = ({k: v for k, v in (attrs.get("provenance") or {}).items() if k != "source" and not raw}
            for attrs in (train_attrs, test_attrs))
    if bool(a) != bool(b):
        return "only one of them has a provenance (was one not written by encode-latents?)"
    differences = [f"{key} {_short(a.get(key), b.get(key))}" for key in sorted(a.keys() | b.keys()) if a.get(key) != b.get(key)]
    names_a, names_b = train_attrs.get("class_names") or [], test_attrs.get("class_names") or []
    if names_a and names_b and names_a != names_b:
        differences.append(f"class_names {_short(names_a, names_b)}")
    return "; ".join(differences) or None


def _short(a: Any, b: Any) -> str:
    """'A vs B' for two differing values; for dicts only the keys that differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        a, b = {k: a.get(k) for k in keys}, {k: b.get(k) for k in keys}

    def text(v: Any) -> str:
        out = json.dumps(v, sort_keys=True, default=str)
        return out if len(out) <= 80 else out[:77] + "..."

    return f"{text(a)} vs {text(b)}"


def load_pair(train: str | Path, test: str | Path, raw: bool = False, tokens: bool = False,
              allow_mismatch: bool = False, raw_pool: int = 1) -> tuple[Features, Features, int, str | None]:
    """Loads TRAIN and TEST, checks they agree; returns them, the number of classes, and how their
    encodings differ (None when they match; an InputError unless `allow_mismatch`)."""
    try:  # before loading: raw audio is turned into log-mel features on the way in
        a, b = store.read_attributes(train), store.read_attributes(test)
    except InputError:
        a = b = {}  # load_features names what is wrong
    if "audio" in (a.get("modality"), b.get("modality")) and a.get("sample_rate") != b.get("sample_rate"):
        raise InputError(f"sample rates differ: {train} is at {a.get('sample_rate')} Hz, {test} at "
                         f"{b.get('sample_rate')} Hz (ingest both with the same --sample-rate)")
    tr = load_features(train, raw, tokens, raw_pool)
    te = load_features(test, raw, tokens, raw_pool)
    if raw and tr.attrs.get("modality") != te.attrs.get("modality"):
        raise InputError(f"modalities differ: {tr.path} holds {tr.attrs.get('modality')!r}, {te.path} "
                         f"{te.attrs.get('modality')!r} (--raw compares inputs of one kind)")
    if (raw or tr.attrs.get("modality") != "latent") and tr.sample_shape != te.sample_shape:
        raise InputError(f"sample shapes differ: {tr.path} has {list(tr.sample_shape)}, "
                         f"{te.path} has {list(te.sample_shape)} (ingest both with the same --size and --channels)")
    mismatch = encoding_mismatch(tr.attrs, te.attrs, raw)
    if mismatch and not allow_mismatch:
        raise InputError(f"{tr.path} and {te.path} were not encoded alike ({mismatch}); encode both with the "
                         "same run, step, --weights, --pool and --layers, or pass --allow-mismatch")
    if tr.x.shape[-1] != te.x.shape[-1]:
        raise InputError(f"feature dimensions differ: {tr.path} has {tr.x.shape[-1]}, "
                         f"{te.path} has {te.x.shape[-1]}")
    num_classes = int(max(tr.labels.max(), te.labels.max())) + 1
    num_classes = max(num_classes, len(tr.class_names))
    if len(np.unique(tr.labels)) < 2:
        raise InputError(f"{tr.path}: a probe needs at least two classes in TRAIN")
    return tr, te, num_classes, mismatch


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


TOP_K = 5  # the second accuracy every probe reports, besides top-1


def topk_accuracy(labels: np.ndarray, ranked: np.ndarray, num_classes: int) -> tuple[float, float | None]:
    """Top-1 and top-5 (fractions of `labels` [N]) from class rankings `ranked` [N, >=1] (best first;
    top-5 uses min(5, columns)). Top-5 is None unless there are more than 5 classes: with 5 or
    fewer every label is among the five best, and a top-5 of 1 says nothing."""
    hits = np.asarray(ranked)[:, :TOP_K] == np.asarray(labels)[:, None]
    top5 = float(hits.any(axis=1).mean()) if num_classes > TOP_K else None
    return float(hits[:, 0].mean()), top5


def accuracy_text(top1: float, top5: float | None) -> str:
    """'top-1 0.9123, top-5 0.9876', without the top-5 where it is None (topk_accuracy)."""
    return f"top-1 {top1:.4f}" + (f", top-5 {top5:.4f}" if top5 is not None else "")
