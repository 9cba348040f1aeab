"""Frechet distance between two feature distributions (`jepa fd`), float64 throughout.

FD = |mu_a - mu_b|^2 + tr(S_a + S_b - 2 (S_a S_b)^(1/2)) (Heusel et al. 2017, FID). The trace of the
square root is taken stably from the symmetric PSD matrix S_a^(1/2) S_b S_a^(1/2), which has the
same eigenvalues as S_a S_b: tr((S_a S_b)^(1/2)) = sum_i sqrt(max(lambda_i, 0)).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from jepa_cli.data import store
from jepa_cli.errors import InputError


def _psd_sqrt(s: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh(s)
    return (v * np.sqrt(np.clip(w, 0.0, None))) @ v.T


def frechet_distance(mu_a, cov_a, mu_b, cov_b) -> float:
    mu_a, mu_b = np.asarray(mu_a, np.float64), np.asarray(mu_b, np.float64)
    cov_a, cov_b = np.asarray(cov_a, np.float64), np.asarray(cov_b, np.float64)
    root_a = _psd_sqrt((cov_a + cov_a.T) / 2)
    m = root_a @ cov_b @ root_a
    eig = np.linalg.eigvalsh((m + m.T) / 2)
    tr_sqrt = float(np.sum(np.sqrt(np.clip(eig, 0.0, None))))
    diff = mu_a - mu_b
    return float(max(diff @ diff + np.trace(cov_a) + np.trace(cov_b) - 2.0 * tr_sqrt, 0.0))


def statistics(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance (ddof 1), float64, of features [N, D]."""
    f = np.asarray(features, np.float64)
    return f.mean(axis=0), np.atleast_2d(np.cov(f, rowvar=False))


def dataset_features(path: str | Path, run: str | Path | None = None, batch_size: int = 128,
                     on_log: Callable[[str], None] | None = None) -> np.ndarray:
    """[N, D] float64 features of a dataset: latents as they are ([N, T, D] averaged over T); images
    as flattened pixels in [0, 1], or with `run` the mean-pooled tokens of its target encoder."""
    path = Path(path)
    attrs = store.read_attributes(path)
    if attrs.get("jepa_kind", "dataset") != "dataset" or not (path / "inputs").exists():
        raise InputError(f"{path}: not a dataset (needs an 'inputs' array)")
    modality = attrs.get("modality", "image")
    if modality == "latent":
        z = store.read_array(path / "inputs").astype(np.float64)
        return z.mean(axis=1) if z.ndim == 3 else z.reshape(len(z), -1)
    if modality != "image":
        raise InputError(f"{path}: fd compares latent or image datasets, not {modality!r}")
    if run is None:
        x = store.read_array(path / "inputs")
        return x.reshape(len(x), -1).astype(np.float64) / 255.0
    return encode_images(path, run, batch_size, on_log)


def encode_images(path: Path, run: str | Path, batch_size: int, on_log=None) -> np.ndarray:
    """The run's target (EMA) encoder over the images (its evaluation transform), mean-pooled."""
    from jepa_cli.evaluation.encode import _prepare, make_step, select_encoder
    from jepa_cli.training.run import load_run

    run = Path(run)
    if not run.is_dir():
        raise InputError(f"{run}: no such run directory")
    config, objective, host, _step = load_run(run, None, on_fallback=lambda _s, m: (on_log or (lambda _m: None))(m))
    if getattr(objective, "generative", False):
        raise InputError(f"{run}: objective {config.get('objective')!r} has no encoder; --run takes a JEPA run")
    params = select_encoder(objective, host, "target", run)
    transform = objective.eval_transform((config.get("objective_config") or {}).get("image_size"))
    step, placed = make_step(lambda p, im: objective.encode(p, im), params, "mean")
    inputs = store.open_array(path / "inputs")
    n = int(inputs.shape[0])
    bs = min(batch_size, n)
    out = []
    for a in range(0, n, bs):
        raw = store.read(inputs, slice(a, min(a + bs, n)))
        out.append(np.asarray(step(placed, _prepare(raw, transform, bs)))[:len(raw)])
    return np.concatenate(out).astype(np.float64)


def fd_datasets(a: str | Path, b: str | Path, run: str | Path | None = None, batch_size: int = 128,
                on_log=None) -> dict[str, Any]:
    fa = dataset_features(a, run, batch_size, on_log)
    fb = dataset_features(b, run, batch_size, on_log)
    if fa.shape[1] != fb.shape[1]:
        raise InputError(f"{a} has {fa.shape[1]}-dimensional features, {b} has {fb.shape[1]}; fd needs the same")
    for path, f in ((a, fa), (b, fb)):
        if len(f) < 2:
            raise InputError(f"{path}: fd needs at least 2 samples, got {len(f)}")
    if not (np.isfinite(fa).all() and np.isfinite(fb).all()):
        raise InputError("features hold non-finite values")
    value = frechet_distance(*statistics(fa), *statistics(fb))
    return {"fd": value, "n_a": int(len(fa)), "n_b": int(len(fb)), "dim": int(fa.shape[1])}
