"""Frechet distance between two feature distributions (`jepa fd`), float64 throughout.

FD = |mu_a - mu_b|^2 + tr(S_a + S_b - 2 (S_a S_b)^(1/2)) (Heusel et al. 2017, FID), S the covariances
(ddof 1). tr((S_a S_b)^(1/2)) is the sum of the square roots of the eigenvalues of S_a S_b, taken one
of two exact ways, whichever costs fewer operations:

- "covariance" (D below the sample counts): the eigenvalues of the symmetric PSD matrix
  S_a^(1/2) S_b S_a^(1/2), which are those of S_a S_b; D x D matrices, O(N D^2 + D^3).
- "gram" (D above them, e.g. raw pixels): with A, B the centred features [N_a, D], [N_b, D],
  S_a S_b = A^T A B^T B / c (c = (N_a - 1)(N_b - 1)) has the nonzero eigenvalues of
  (A B^T)^T (A B^T) / c, so the sum is that of the singular values of A B^T [N_a, N_b], over
  sqrt(c); no D x D matrix, O(N_a N_b D).

Improved precision and recall (Kynkaanniemi et al. 2019, k = 3 in the paper), in the same feature
space: each set's manifold is the union of balls around its samples, each ball reaching that sample's
k-th nearest neighbour within its own set. Precision: the share of B's samples (generated) inside A's
manifold (real, the reference); recall: the share of A's samples inside B's. FD's one number mixes
both; these two say which one a set lacks (fidelity or diversity).

Density and coverage (Naeem et al. 2020, "Reliable fidelity and diversity metrics", eq. 3-4) use
only the reference set's balls, so that spread-out generated samples cannot inflate them: density
is the number of A's balls that hold each of B's samples, averaged and divided by k (about 1 when B
is distributed as A, above 1 where B crowds A's dense regions); coverage is the share of A's samples
whose ball holds at least one of B's. Recall counts A's samples inside B's balls, and a sample far
from every real one has a wide ball (its k-th neighbour is far), so blurred, scattered samples reach
a high recall; coverage does not reward them. The N_a x N_b distances are taken a block of rows at a
time (PR_BLOCK_BYTES).

With `standardise`, every feature is first shifted and scaled by the reference set A's mean and std,
so that no few wide features dominate the distances and the FD.

The memory all of this needs (the features, the chosen method's matrices, the distance blocks) is
checked before anything of that size is allocated.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

from jepa_cli.data import resources, store
from jepa_cli.errors import InputError

READ_BYTES = 64 << 20  # float64 bytes of features read per step of a pass over a stored array
COVARIANCE_MATRICES = 8  # D x D float64 matrices alive at once: S_a, S_b, eigh's vectors and workspace, ...
GRAM_MATRICES = 3  # N_a x N_b float64 matrices alive at once: A B^T and the SVD's workspace
PR_BLOCK_BYTES = 64 << 20  # float64 bytes of one block of pairwise distances (precision, recall, ...)
PR_K = 3  # Kynkaanniemi et al. 2019, Sec. 3 (k = 3 is their default)
DC_K = 5  # Naeem et al. 2020's k for density and coverage (clovaai/generative-evaluation-prdc README: nearest_k = 5)


def _psd_sqrt(s: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh(s)
    return (v * np.sqrt(np.clip(w, 0.0, None))) @ v.T


def frechet_distance(mu_a, cov_a, mu_b, cov_b) -> float:
    """FD of two Gaussians given by their means [D] and covariances [D, D] (the covariance method)."""
    mu_a, mu_b = np.asarray(mu_a, np.float64), np.asarray(mu_b, np.float64)
    cov_a, cov_b = np.asarray(cov_a, np.float64), np.asarray(cov_b, np.float64)
    root_a = _psd_sqrt((cov_a + cov_a.T) / 2)
    m = root_a @ cov_b @ root_a
    eig = np.linalg.eigvalsh((m + m.T) / 2)
    tr_sqrt = float(np.sum(np.sqrt(np.clip(eig, 0.0, None))))
    diff = mu_a - mu_b
    return float(max(diff @ diff + np.trace(cov_a) + np.trace(cov_b) - 2.0 * tr_sqrt, 0.0))


def fd_method(n_a: int, n_b: int, dim: int) -> tuple[str, int]:
    """("covariance" or "gram", the bytes its matrices need beyond the features): the method with
    fewer floating-point operations, counted as 2 N D^2 + 25 D^3 (covariances, eigh twice, products)
    against 2 N_a N_b D + 4 min(N)^2 max(N) (the cross product and its singular values)."""
    covariance = 2 * (n_a + n_b) * dim**2 + 25 * dim**3
    gram = 2 * n_a * n_b * dim + 4 * min(n_a, n_b) ** 2 * max(n_a, n_b)
    if covariance <= gram:
        return "covariance", COVARIANCE_MATRICES * dim * dim * 8
    return "gram", GRAM_MATRICES * n_a * n_b * 8


def frechet_distance_of_features(fa: np.ndarray, fb: np.ndarray, method: str | None = None) -> float:
    """FD between the feature sets fa [N_a, D] and fb [N_b, D] (float64; both are centred in place,
    so no copy of them is made). `method`: "covariance" or "gram" (default: `fd_method`'s choice)."""
    n_a, n_b = len(fa), len(fb)
    method = method or fd_method(n_a, n_b, fa.shape[1])[0]
    mu_a, mu_b = fa.mean(axis=0), fb.mean(axis=0)
    fa -= mu_a
    fb -= mu_b
    if method == "covariance":
        return frechet_distance(mu_a, fa.T @ fa / (n_a - 1), mu_b, fb.T @ fb / (n_b - 1))
    scale = (n_a - 1) * (n_b - 1)
    tr_sqrt = float(np.linalg.svd(fa @ fb.T, compute_uv=False).sum()) / math.sqrt(scale)
    diff = mu_a - mu_b
    traces = float(np.vdot(fa, fa)) / (n_a - 1) + float(np.vdot(fb, fb)) / (n_b - 1)
    return float(max(diff @ diff + traces - 2.0 * tr_sqrt, 0.0))


def _squared_norms(x: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", x, x)


def _block_rows(n: int) -> int:
    """Rows of a block of distances to n points that fit in PR_BLOCK_BYTES (two such arrays live)."""
    return max(1, PR_BLOCK_BYTES // (2 * 8 * max(n, 1)))


def _squared_distances(x: np.ndarray, x_norms: np.ndarray, y: np.ndarray, y_norms: np.ndarray) -> np.ndarray:
    """|x_i - y_j|^2 [len(x), len(y)] as |x|^2 + |y|^2 - 2 x.y, clipped at 0 (rounding can go below)."""
    d = x @ y.T
    d *= -2.0
    d += x_norms[:, None]
    d += y_norms[None, :]
    return np.maximum(d, 0.0, out=d)


def knn_radii(x: np.ndarray, k: int) -> np.ndarray:
    """Squared distance from each row of x [N, D] to its k-th nearest other row (the sample itself,
    at distance 0, is not counted), computed a block of rows at a time; needs k < N."""
    norms = _squared_norms(x)
    out = np.empty(len(x))
    rows = _block_rows(len(x))
    for a in range(0, len(x), rows):
        d = _squared_distances(x[a:a + rows], norms[a:a + rows], x, norms)
        d[np.arange(len(d)), np.arange(a, a + len(d))] = -1.0  # itself: sorted first, never counted
        out[a:a + rows] = np.partition(d, k, axis=1)[:, k]
    return out


def count_in_balls(centres: np.ndarray, radii: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Balls around `centres` [N, D] (squared radii [N]) against `queries` [M, D]: for each query the
    number of balls holding it [M], for each ball whether it holds some query [N]. A point on a ball's
    edge is inside. One pass over the N x M distances, a block of rows at a time."""
    norms, q_norms = _squared_norms(centres), _squared_norms(queries)
    held, holds_some = np.zeros(len(queries), np.int64), np.zeros(len(centres), bool)
    rows = _block_rows(len(queries))
    for a in range(0, len(centres), rows):
        inside = _squared_distances(centres[a:a + rows], norms[a:a + rows], queries, q_norms) <= radii[a:a + rows, None]
        held += np.count_nonzero(inside, axis=0)
        holds_some[a:a + rows] = inside.any(axis=1)
    return held, holds_some


def precision_recall_bytes(n_a: int, n_b: int) -> int:
    """The bytes precision_recall needs beyond the features: one block of distances and its partition
    or comparison (two arrays of a block's rows), the norms and the radii."""
    n = max(n_a, n_b)
    return 2 * 8 * n * min(n, _block_rows(n)) + 3 * 8 * (n_a + n_b)


def _check_k(k: int, option: str, real: np.ndarray, fake: np.ndarray) -> None:
    for name, x in (("the reference set (A)", real), ("the compared set (B)", fake)):
        if not 1 <= k < len(x):
            raise InputError(f"{option} {k} needs 1 <= k < the sample count; {name} has {len(x)} samples")


def precision_recall(real: np.ndarray, fake: np.ndarray, k: int = PR_K) -> dict[str, float]:
    """Improved precision and recall (Kynkaanniemi et al. 2019, eq. 1-2) of `fake` [N_b, D] against
    `real` [N_a, D]: the share of fake samples inside real's k-NN manifold (the union of each real
    sample's ball to its k-th neighbour), the share of real samples inside fake's. InputError unless
    k < both sample counts."""
    _check_k(k, "--k", real, fake)
    in_real, _ = count_in_balls(real, knn_radii(real, k), fake)
    in_fake, _ = count_in_balls(fake, knn_radii(fake, k), real)
    return {"precision": float(np.mean(in_real > 0)), "recall": float(np.mean(in_fake > 0))}


def density_coverage(real: np.ndarray, fake: np.ndarray, k: int = DC_K) -> dict[str, float]:
    """Density and coverage (Naeem et al. 2020, eq. 3-4) of `fake` [M, D] against `real` [N, D], on
    real's balls alone: the real balls holding each fake sample, summed over k M (about 1 when fake is
    distributed as real); the share of real balls holding some fake sample. InputError unless k < both
    sample counts."""
    _check_k(k, "--dc-k", real, fake)
    held, holds_some = count_in_balls(real, knn_radii(real, k), fake)
    return {"density": int(held.sum()) / (k * len(fake)), "coverage": float(np.mean(holds_some))}


def standardise(fa: np.ndarray, fb: np.ndarray, name_a: str) -> None:
    """Shifts and scales both feature sets in place by the reference set fa's per-feature mean and
    std (ddof 0); InputError naming the first feature that is constant in fa (its std is 0)."""
    mean = fa.mean(axis=0)
    std = fa.std(axis=0)
    constant = np.flatnonzero(std == 0.0)
    if len(constant):
        raise InputError(f"{name_a}: --standardise divides by each feature's std in this reference set, but "
                         f"{len(constant)} of its {fa.shape[1]} features are constant (the first: feature "
                         f"{int(constant[0])}); drop --standardise")
    for f in (fa, fb):
        f -= mean
        f /= std


def sample_count_warnings(n_a: int, n_b: int, dim: int, names: tuple[str, str]) -> list[str]:
    """Warnings for sample counts too small for dim-dimensional FD statistics: fewer samples than
    dimensions (a singular covariance: FD then compares at most N - 1 directions), or fewer than
    2 x dim (a covariance estimate that noisy biases FD upwards, Chong & Forsyth 2020)."""
    out = []
    for name, n in zip(names, (n_a, n_b)):
        if n < dim:
            out.append(f"{name}: {n} samples of {dim}-dimensional features: the covariance is singular (rank at "
                       f"most {n - 1}); FD compares only the directions the samples span")
        elif n < 2 * dim:
            out.append(f"{name}: {n} samples of {dim}-dimensional features, fewer than 2 x {dim}: the covariance "
                       "estimate is noisy and FD biased upwards; compare sets of equal size only")
    return out


def _dataset(path: str | os.PathLike, has_run: bool) -> SimpleNamespace:
    """A dataset fd can compare: its attributes, modality, sample count and stored row shape."""
    path = Path(path)
    attrs = store.read_attributes(path)
    if attrs.get("jepa_kind", "dataset") != "dataset" or not (path / "inputs").exists():
        raise InputError(f"{path}: not a dataset (needs an 'inputs' array)")
    modality = attrs.get("modality", "image")
    if modality not in ("latent", "image") and not has_run:
        raise InputError(f"{path}: fd compares {modality} datasets in an encoder's space; pass --run with a run "
                         f"that encodes {modality}")
    shape = tuple(int(s) for s in store.open_array(path / "inputs").shape)
    return SimpleNamespace(path=path, attrs=attrs, modality=modality, n=shape[0], shape=shape[1:])


def _load_encoder(run: str | os.PathLike, batch_size: int, log: Callable[[str], None],
                  load_run: Callable | None) -> SimpleNamespace:
    """The run's target (EMA) encoder, mean-pooled and jitted, with its evaluation transform."""
    from jepa_cli.evaluation.encode import make_step
    from jepa_cli.training.encoder import select_encoder

    run = Path(run)
    if not run.is_dir():
        raise InputError(f"{run}: no such run directory")
    if load_run is None:
        from jepa_cli.training.run import load_run
    config, objective, host, _step = load_run(run, None, on_fallback=lambda _s, message: log(message))
    if getattr(objective, "generative", False):
        raise InputError(f"{run}: objective {config.get('objective')!r} has no encoder; --run takes a JEPA run")
    params = select_encoder(objective, host, "target", run)
    objective_config = config.get("objective_config") or {}
    step, placed = make_step(lambda p, x: objective.encode(p, x), params, "mean")
    return SimpleNamespace(run=run, name=config.get("objective"), objective=objective, config=objective_config,
                           transform=objective.eval_transform(objective_config.get("image_size")), step=step,
                           placed=placed, batch_size=batch_size)


def _encoded_dim(ds: SimpleNamespace, encoder: SimpleNamespace) -> int:
    """The width of the encoder's pooled features on `ds`'s samples; InputError for samples it cannot
    take (another modality, other channels or sample rate, a shape the network refuses)."""
    import jax

    from jepa_cli.evaluation.encode import prepare_batch
    from jepa_cli.evaluation.features import check_modality_pair
    from jepa_cli.evaluation.run_encoder import check_channels, check_sample_rate

    check_modality_pair(ds.path, ds.modality, encoder.objective, encoder.run)
    check_channels(ds.path, ds.attrs, encoder.config.get("channels"), encoder.run)
    check_sample_rate(ds.path, ds.attrs, encoder.config.get("sample_rate"), encoder.run)
    probe = prepare_batch(store.read(store.open_array(ds.path / "inputs"), slice(0, 1)), encoder.transform,
                     encoder.batch_size, ds.modality)
    try:
        shape = jax.eval_shape(encoder.step, encoder.placed, jax.ShapeDtypeStruct(probe.shape, probe.dtype)).shape
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - a shape the encoder cannot take is a user error
        raise InputError(f"{ds.path}: the encoder of {encoder.run} cannot take samples of shape "
                         f"{list(probe.shape[1:])} ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None
    return int(shape[-1])


def _feature_dim(ds: SimpleNamespace, encoder: SimpleNamespace | None) -> int:
    """D of `ds`'s features: a latent's channels ([N, T, D] is averaged over T), an image's pixels,
    or the encoder's width."""
    if ds.modality == "latent":
        return ds.shape[-1] if len(ds.shape) == 2 else int(np.prod(ds.shape))
    if encoder is None:
        return int(np.prod(ds.shape))
    return _encoded_dim(ds, encoder)


def _features(ds: SimpleNamespace, dim: int, encoder: SimpleNamespace | None,
              on_progress: Callable[[int], None]) -> np.ndarray:
    """float64 [N, dim] features of `ds`, filled a block of rows at a time (reported through
    `on_progress(rows)`); InputError naming the dataset and row at a non-finite value."""
    inputs = store.open_array(ds.path / "inputs")
    out = np.empty((ds.n, dim), np.float64)
    encode = encoder is not None and ds.modality != "latent"
    if encode:
        from jepa_cli.evaluation.encode import prepare_batch

        rows = encoder.batch_size
    else:
        rows = max(1, READ_BYTES // (8 * max(1, int(np.prod(ds.shape)))))
    for a in range(0, ds.n, rows):
        b = min(a + rows, ds.n)
        raw = store.read(inputs, slice(a, b))
        if encode:
            x = prepare_batch(raw, encoder.transform, encoder.batch_size, ds.modality)
            out[a:b] = np.asarray(encoder.step(encoder.placed, x))[:b - a]
        elif ds.modality == "latent":
            out[a:b] = raw.mean(axis=1, dtype=np.float64) if raw.ndim == 3 else raw.reshape(b - a, -1)
        else:
            out[a:b] = raw.reshape(b - a, -1)
            out[a:b] /= 255.0
        bad = np.flatnonzero(~np.isfinite(out[a:b]).all(axis=1))
        if len(bad):
            raise InputError(f"{ds.path}: the features of sample {a + int(bad[0])} are not finite (NaN or inf); "
                             "fd needs finite ones")
        on_progress(b - a)
    return out


def fd_datasets(a: str | Path, b: str | Path, run: str | Path | None = None, batch_size: int = 128,
                on_log: Callable[[str], None] | None = None, on_start: Callable[[int], None] | None = None,
                on_progress: Callable[[int], None] | None = None, load_run: Callable | None = None,
                k: int | None = None, standardise_features: bool = False,
                dc_k: int | None = None) -> dict[str, Any]:
    """FD, precision, recall, density and coverage between the feature distributions of datasets `a`
    (the reference) and `b` (see `_feature_dim`; `k` for precision_recall, `dc_k` for
    density_coverage; `standardise_features`: by a's mean and std first); returns {"fd", "precision",
    "recall", "density", "coverage", "k", "dc_k", "standardised", "n_a", "n_b", "dim", "method"}. A k
    given is refused unless both sets have more samples; a default k (PR_K, DC_K) on a set that small
    gives its two figures None, with a warning. Everything is checked (the datasets, the run, k, the memory) before features are read;
    `on_start(samples)` then gives the work, `on_progress(samples)` its course, `on_log` the warnings. `load_run`: what loads the run (default
    `jepa_cli.training.run.load_run`)."""
    log = on_log or (lambda message: None)
    sets = [_dataset(a, run is not None), _dataset(b, run is not None)]
    for ds in sets:
        if ds.n < 2:
            raise InputError(f"{ds.path}: fd needs at least 2 samples, got {ds.n}")
    warnings = []  # said once everything is checked: a refused command prints only its error line
    chosen = {}
    for option, given, default, figures in (("--k", k, PR_K, "precision and recall"),
                                            ("--dc-k", dc_k, DC_K, "density and coverage")):
        for ds in sets:
            if given is not None and not 1 <= given < ds.n:
                raise InputError(f"{option} {given} needs 1 <= k < the sample count (a sample's k-th neighbour in "
                                 f"its own set); {ds.path} has {ds.n} samples")
            if given is None and ds.n <= default:
                warnings.append(f"{ds.path}: {ds.n} samples; {figures} need more than {option[2:]} = {default} in "
                                "each set (reported as null)")
        chosen[option] = default if given is None else given
    k, dc_k = chosen["--k"], chosen["--dc-k"]
    with_pr, with_dc = (all(ds.n > n for ds in sets) for n in (k, dc_k))
    encoder = _load_encoder(run, batch_size, log, load_run) if run is not None else None
    if encoder is not None:
        encoder.batch_size = min(batch_size, max(ds.n for ds in sets))  # one compiled shape for both
    dims = [_feature_dim(ds, encoder) for ds in sets]
    if dims[0] != dims[1]:
        raise InputError(f"{a} has {dims[0]}-dimensional features, {b} has {dims[1]}; fd needs the same")
    dim, (n_a, n_b) = dims[0], (sets[0].n, sets[1].n)
    method, work_bytes = fd_method(n_a, n_b, dim)
    need, free = (n_a + n_b) * dim * 8 + max(work_bytes, precision_recall_bytes(n_a, n_b)), resources.available_memory()
    if free is not None and need > free:
        raise InputError(f"{a} and {b}: fd of {dim}-dimensional features ({n_a} + {n_b} samples, float64, and the "
                         f"{method} method's matrices) needs about {resources.format_bytes(need)} of memory but "
                         f"{resources.format_bytes(free)} is available; compare in an encoder's space (--run RUN) "
                         "or at a smaller image size (jepa ingest --size)")
    if on_start:
        on_start(n_a + n_b)
    fa, fb = (_features(ds, dim, encoder, on_progress or (lambda rows: None)) for ds in sets)
    # the statistics sum up to N D products of centred values (at most twice the peak): beyond this
    # bound they overflow float64, and LAPACK would print its complaints and return NaN
    limit = math.sqrt(np.finfo(np.float64).max / (16 * max(n_a, n_b) * dim))
    for ds, f in zip(sets, (fa, fb)):
        peak = float(np.abs(f).max())
        if peak > limit:
            raise InputError(f"{ds.path}: features reach {peak:.3g} in magnitude; fd's float64 statistics of "
                             f"{ds.n} samples overflow beyond {limit:.3g}")
    if standardise_features:
        standardise(fa, fb, str(a))
    for message in dict.fromkeys(warnings + sample_count_warnings(n_a, n_b, dim, (str(a), str(b)))):
        log(message)
    # before FD: it centres fa, fb
    neighbourhood = {**(precision_recall(fa, fb, k) if with_pr else dict.fromkeys(("precision", "recall"))),
                     **(density_coverage(fa, fb, dc_k) if with_dc else dict.fromkeys(("density", "coverage")))}
    value = frechet_distance_of_features(fa, fb, method)
    return {"fd": value, **neighbourhood, "k": int(k), "dc_k": int(dc_k),
            "standardised": bool(standardise_features), "n_a": int(n_a), "n_b": int(n_b), "dim": int(dim),
            "method": method}
