"""Encoding a dataset with a frozen encoder into a latent dataset (`jepa encode-latents`).

`encode_dataset(source, output, encode_fn, params, transform, ...)` holds the mechanics, for any
`encode_fn(params, images [B, H, W, C] float32) -> tokens [B, T, D]`: batches (the last one padded
to the same static shape), optionally sharded over a mesh (batch over data x fsdp, parameters by
the trainer's fsdp rule), mean pooling or not, a streaming per-channel mean and 1/std, and
chunk-wise resumable writing. `encode_run` (evaluation/run_encoder.py) calls it with the encoder of
a training run's checkpoint.

Resumability (`jepa_cli.data.resumable`): rows are processed in units of whole zarr chunks, and
after a unit is written its statistics (count, mean, M2 per channel, float64) are kept in its
progress file. A rerun of the same job (same run, step, weights, pool, layers, and the same source
content: `store.dataset_fingerprint`) skips the recorded units; a different job, or a source
re-ingested meanwhile, discards the partial (reported through `on_log`). When every unit is done,
the statistics are merged in unit order (so interrupted and uninterrupted runs give identical
attributes), labels are copied, the group metadata is written and the directory is renamed into place.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from jepa_cli.data import atomic, locks, resumable, store
from jepa_cli.data.jsonvalues import json_value
from jepa_cli.data.resumable import partial_path
from jepa_cli.data.urls import location
from jepa_cli.errors import InputError, raise_if_signalled_since, signal_mark

POOLS = ("mean", "none")


# -- the jitted, optionally sharded, encoding step ---------------------------------------------

def pooled_features(encode_fn: Callable, pool: str) -> Callable:
    """features(params, images) -> float32 [B, D] (pool "mean") or [B, T, D] (pool "none")."""
    import jax

    def features(p, images):
        z = encode_fn(p, images)
        if z.ndim != 3:
            raise InputError(f"the encoder returned shape {tuple(z.shape)}, expected [B, T, D]")
        z = z.astype(jax.numpy.float32)
        return z.mean(axis=1) if pool == "mean" else z

    return features


def make_step(encode_fn: Callable, params: Any, pool: str, mesh=None):
    """(step(params, images) -> features, params placed on the devices)."""
    import jax

    features = pooled_features(encode_fn, pool)
    if mesh is None:
        return jax.jit(features), jax.device_put(params)
    from jepa_cli.training import mesh as meshlib  # imports JAX, which this module's top leaves out

    shardings = meshlib.state_shardings(mesh, params)
    batch = meshlib.batch_sharding(mesh)
    step = jax.jit(features, in_shardings=(shardings, batch), out_shardings=batch)
    return step, jax.device_put(params, shardings)


# -- streaming statistics ------------------------------------------------------------------------

def chunk_stats(z: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """(count, mean, M2) per channel (last axis) of one block, float64."""
    flat = z.reshape(-1, z.shape[-1]).astype(np.float64)
    mean = flat.mean(axis=0)
    m2 = ((flat - mean) ** 2).sum(axis=0)
    return flat.shape[0], mean, m2


def merge_stats(a: tuple[int, np.ndarray, np.ndarray], b: tuple[int, np.ndarray, np.ndarray]):
    """Chan et al.'s parallel merge of (count, mean, M2)."""
    na, ma, sa = a
    nb, mb, sb = b
    n = na + nb
    delta = mb - ma
    mean = ma + delta * (nb / n)
    m2 = sa + sb + delta**2 * (na * nb / n)
    return n, mean, m2


def shift_scale(stats) -> tuple[list[float], list[float]]:
    """latent_shift = mean, latent_scale = 1/std (population std; 1/1e-6 caps a constant channel)."""
    n, mean, m2 = stats
    std = np.sqrt(m2 / max(n, 1))
    scale = 1.0 / np.maximum(std, 1e-6)
    return [float(v) for v in mean.astype(np.float32)], [float(v) for v in scale.astype(np.float32)]


def feature_shape(step: Callable, placed: Any, first: np.ndarray, transform: Callable | None, batch_size: int,
                  modality: str, where: str) -> tuple[int, ...]:
    """The shape of one sample's features, from `first` (raw samples [1, ...]) traced through `step`
    at `batch_size`; InputError naming `where` for samples the encoder cannot take."""
    import jax

    shape = first.shape[1:]
    try:
        probe_x = prepare_batch(first, transform, batch_size, modality)
        shape = probe_x.shape[1:]
        out_shape = jax.eval_shape(step, placed, jax.ShapeDtypeStruct(probe_x.shape, probe_x.dtype)).shape
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - a shape the transform or encoder cannot take is a user error
        raise InputError(f"{where}: the encoder cannot take samples of shape {list(shape)} "
                         f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None
    return tuple(int(s) for s in out_shape[1:])


def encoded_batches(step: Callable, placed: Any, raw: np.ndarray, transform: Callable | None, batch_size: int,
                    modality: str) -> Iterator[np.ndarray]:
    """The features of `raw`'s samples, one batch of `batch_size` rows at a time (the last padded to
    the same static shape, its padding rows dropped); batch s+1 is prepared while s runs."""
    pending = None
    for s in range(0, len(raw), batch_size):
        out = step(placed, prepare_batch(raw[s:s + batch_size], transform, batch_size, modality))
        if pending is not None:
            yield np.asarray(pending[0])[:pending[1]]
        pending = (out, min(batch_size, len(raw) - s))
    if pending is not None:
        yield np.asarray(pending[0])[:pending[1]]


def check_finite_rows(z: np.ndarray, rows: str, encoder_name: str) -> None:
    """InputError when any of the embeddings `z` [N, ...] (samples `rows`, e.g. "0..9 of DATA") holds
    NaN or inf, saying how many."""
    bad = int(np.count_nonzero(~np.isfinite(z.reshape(len(z), -1)).all(axis=1)))
    if bad:
        raise InputError(f"{encoder_name} gives non-finite embeddings (NaN or inf) for {bad} of the "
                         f"{len(z)} samples {rows}")


# -- the mechanics -------------------------------------------------------------------------------

def prepare_batch(images: np.ndarray, transform: Callable | None, batch_size: int, key: str = "image") -> np.ndarray:
    """Transforms a batch of raw samples per example (each as {key: sample}, key the dataset's
    modality), then pads it to `batch_size` rows."""
    if transform is None:
        x = np.asarray(images, np.float32)
    else:
        rng = np.random.default_rng(0)  # evaluation transforms are deterministic; the seed is unused
        x = np.stack([np.asarray(transform({key: img}, rng)[key], np.float32) for img in images])
    if len(x) < batch_size:
        x = np.concatenate([x, np.zeros((batch_size - len(x),) + x.shape[1:], x.dtype)])
    return x


def source_attributes(source: str | os.PathLike) -> dict[str, Any]:
    """The group attributes of a dataset that can be encoded; InputError for anything else (a mask
    file, a run, a latent set, a folder)."""
    attrs = store.read_attributes(source)
    if attrs.get("jepa_kind", "dataset") != "dataset" or not (location(source) / "inputs").exists():
        raise InputError(f"{source}: not a dataset (needs an 'inputs' array)")
    if attrs.get("modality") == "latent":
        provenance = attrs.get("provenance")
        origin = provenance.get("source") if isinstance(provenance, dict) else None
        made_from = (f"the dataset it was encoded from, {origin}" if origin
                     else "the image, audio or video dataset it was encoded from")
        raise InputError(f"{source}: is already a latent dataset (encode-latents' output): give {made_from}, or "
                         f"probe it as it is, without --run (jepa probe knn {source} TEST.zarr)")
    return attrs


def encode_dataset(source: str | os.PathLike, output: str | os.PathLike, encode_fn: Callable, params: Any,
                   transform: Callable | None = None, *, pool: str = "mean", batch_size: int = 128, mesh=None,
                   job: dict[str, Any] | None = None, attributes: dict[str, Any] | None = None,
                   force: bool = False, unit_rows: int | None = None, chunk_n: int | None = None,
                   on_progress: Callable[[int], None] | None = None,
                   on_start: Callable[[int, int], None] | None = None,
                   on_log: Callable[[str], None] | None = None, encoder_name: str = "the encoder") -> dict[str, Any]:
    """Encodes `source`'s inputs into the latent dataset `output`; returns a summary.

    A unit whose embeddings hold NaN or inf is never written: an InputError names `encoder_name`
    (e.g. "RUN at step N"), how many of the unit's rows are affected and which rows, and `output` is
    not written (units finished before it stay in the resumable partial).

    `job`: what identifies this computation for resuming (JSON-able; the source path and content
    fingerprint, pool and batch layout are added). `attributes`: extra group attributes (e.g.
    provenance). `on_start(total_rows, rows_already_done)` and `on_progress(rows)` report progress;
    `on_log(message)` says when a partial output is discarded or a damaged unit recomputed.
    """
    log = on_log or (lambda message: None)
    mark = signal_mark()
    source, output = location(source), location(output)
    src_attrs, inputs, n = _checked_input(source, output, pool, force)
    batch_size = _batch_size(batch_size, n, mesh)
    step, placed = make_step(encode_fn, params, pool, mesh)
    modality = src_attrs.get("modality", "image")
    sample_shape = feature_shape(step, placed, store.read(inputs, slice(0, 1)), transform, batch_size, modality,
                                 str(source))

    def encode_rows(a: int, b: int) -> np.ndarray:
        parts = []
        for part in encoded_batches(step, placed, store.read(inputs, slice(a, b)), transform, batch_size, modality):
            parts.append(part)
            if on_progress:
                on_progress(len(part))
        z = np.concatenate(parts, axis=0)
        check_finite_rows(z, f"{a}..{b - 1} of {source}; {output} not written", encoder_name)
        return z

    chunk_n = chunk_n or store.chunk_rows(sample_shape, 4)
    job = dict(job or {}) | {"source": str(source.resolve()), "source_fingerprint": store.dataset_fingerprint(source),
                             "num_samples": n, "pool": pool, "sample_shape": list(sample_shape)}
    tmp = partial_path(output)
    with locks.resumable_partial(tmp, output):  # one writer per partial output
        units, unit_stats, chunk_n = _open_units(tmp, job, n, unit_rows or max(batch_size, chunk_n), chunk_n, log)
        done = {i for i, stats in unit_stats.items() if stats is not None}
        if on_start:
            on_start(n, sum(units[i][1] - units[i][0] for i in done))
        z_store = store.open_array(tmp / "inputs", write=True) if (tmp / "inputs").exists() else \
            store.create_array(tmp / "inputs", (n,) + sample_shape, np.float32, chunk_n=chunk_n)
        _encode_units(tmp, units, done, unit_stats, encode_rows, z_store, mark)
        shift, scale = shift_scale(functools.reduce(merge_stats, (unit_stats[i] for i in range(len(units)))))
        labels_copied = _write_latent_group(tmp, source, src_attrs, sample_shape, n, shift, scale, attributes)
        raise_if_signalled_since(mark)  # never commit after a signal, even one a callback swallowed (progress kept)
        resumable.finish(tmp)
        atomic.move_into_place(tmp, output, force, "dataset")  # never over an output that appeared meanwhile
        return {"output": str(output), "num_samples": n, "shape": [n, *sample_shape], "pool": pool,
                "batch_size": batch_size, "units": len(units), "units_resumed": len(done),
                "labels": labels_copied, "latent_shift_mean": float(np.mean(shift)),
                "latent_scale_mean": float(np.mean(scale))}


def _checked_input(source: Path, output: Path, pool: str, force: bool) -> tuple[dict[str, Any], Any, int]:
    """`source`'s attributes, its inputs array and their rows; InputError for an unknown `pool`, an
    `output` taken (unless `force`) or that is the source, or a source that is no dataset or is empty."""
    if pool not in POOLS:
        raise InputError(f"--pool must be one of {', '.join(POOLS)}, got {pool!r}")
    atomic.check_output(output, force, "dataset", [source])
    src_attrs = source_attributes(source)
    inputs = store.open_array(source / "inputs")
    n = int(inputs.shape[0])
    if n == 0:
        raise InputError(f"{source}: the dataset is empty")
    return src_attrs, inputs, n


def _open_units(tmp: Path, job: dict[str, Any], n: int, unit_rows: int, chunk_n: int,
                log: Callable[[str], None]) -> tuple[list[tuple[int, int]], dict[int, Any], int]:
    """The units [a, b) of the `n` rows (whole chunks of `chunk_n` rows, at least `unit_rows`; a
    resumed partial `tmp` keeps its recorded layout), each finished unit's (count, mean, M2) (None: to
    encode) and the chunk rows."""
    unit_rows = -(-unit_rows // chunk_n) * chunk_n
    state = resumable.open_partial(tmp, job, {"unit_rows": int(unit_rows), "chunk_n": int(chunk_n)}, log,
                                   changed=lambda known: _why_changed(known, job))
    units = [(a, min(a + state["unit_rows"], n)) for a in range(0, n, state["unit_rows"])]
    return units, {i: _unit_stats(resumable.read_unit(tmp, i, log)) for i in range(len(units))}, state["chunk_n"]


def _write_latent_group(tmp: Path, source: Path, src_attrs: dict[str, Any], sample_shape: tuple[int, ...], n: int,
                        shift: Any, scale: Any, attributes: dict[str, Any] | None) -> bool:
    """The latent dataset's labels (copied from `source`'s, when it has them: returns whether) and its
    attributes: ND or NTD, the source's classes and split, the latents' shift and scale."""
    labels_copied = (source / "labels").exists()
    if labels_copied:
        store.write_array(tmp / "labels", store.read_array(source / "labels"))
    store.write_group(tmp, store.base_attributes(
        "dataset", modality="latent", layout="ND" if len(sample_shape) == 1 else "NTD",
        class_names=list(src_attrs.get("class_names") or []), source=str(source), split=src_attrs.get("split"),
        num_samples=n, latent_shift=shift, latent_scale=scale, **(attributes or {})))
    return labels_copied


def _batch_size(batch_size: int, n: int, mesh: Any) -> int:
    """Rows a step encodes: at most `n`, rounded up to split evenly over the mesh's data x fsdp
    devices (the padding rows are dropped); InputError unless positive."""
    if batch_size <= 0:
        raise InputError(f"--batch-size must be positive, got {batch_size}")
    batch_size = min(batch_size, n)
    if mesh is not None:
        dp = int(mesh.shape["data"] * mesh.shape["fsdp"])
        batch_size = -(-batch_size // dp) * dp
    return batch_size


def _encode_units(tmp: Path, units: list[tuple[int, int]], done: set[int],
                  unit_stats: dict[int, tuple[int, np.ndarray, np.ndarray] | None],
                  encode_rows: Callable[[int, int], np.ndarray], z_store: Any, mark: Any) -> None:
    """Encodes each unit [a, b) not `done` into `z_store`, then records it in the partial `tmp` with
    its (count, mean, M2) statistics, also kept in `unit_stats`; stops at a unit's edge on a signal."""
    for i, (a, b) in enumerate(units):
        if i in done:
            continue
        raise_if_signalled_since(mark)  # a signal whose exception a callback swallowed: stop at a unit's edge
        z = encode_rows(a, b)
        store.complete(lambda: z_store[a:b].write(z))
        unit_stats[i] = chunk_stats(z)
        count, mean, m2 = unit_stats[i]
        resumable.mark_unit(tmp, i, count=np.int64(count), mean=mean, m2=m2)


def _unit_stats(kept: dict[str, np.ndarray] | None) -> tuple[int, np.ndarray, np.ndarray] | None:
    """A finished unit's (count, mean, M2) from what `resumable.mark_unit` kept, or None (not done,
    or kept values that do not fit: the unit is encoded again)."""
    try:
        stats = (int(kept["count"]), np.asarray(kept["mean"], np.float64), np.asarray(kept["m2"], np.float64))
    except (TypeError, KeyError, ValueError):
        return None
    return stats if stats[1].shape == stats[2].shape and stats[1].ndim == 1 else None


def _why_changed(known: dict[str, Any], job: dict[str, Any]) -> str:
    """Why a recorded encoding job differs from this one."""
    job = json_value(job)
    if known.get("source_fingerprint") not in (None, job["source_fingerprint"]) and \
            {k: v for k, v in known.items() if k != "source_fingerprint"} == \
            {k: v for k, v in job.items() if k != "source_fingerprint"}:
        return f"{job['source']} changed since it was started"
    return "it was started by another job (run, step, weights, pool, layers or source differ)"
