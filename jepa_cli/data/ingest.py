"""`jepa ingest`: stream a `Source` into a dataset directory (docs/formats.md), atomically."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jepa_cli.data import atomic, resources, store
from jepa_cli.data.pixels import ImageCodec
from jepa_cli.data.samples import BadSample, Source
from jepa_cli.data.splits import group_names_of, split_attribute, split_indices
from jepa_cli.errors import InputError

# Peak memory of one ingest above the process's own, in units of the write chunk (the buffer,
# TensorStore's copies, the zstd output) and of one sample (decoded, converted, Pillow's 4-byte
# pixels while resizing). Measured peaks (RssAnon): 27 MiB with 4 MiB chunks of small samples
# (the same for 2,000 and 40,000 samples), 7.3-9.6 samples when a chunk holds one sample.
CHUNKS_IN_MEMORY, SAMPLES_IN_MEMORY = 8, 6
INDEX_BYTES = 24  # per sample and per frame of a clip: an int64 index and two temporaries while it is computed


def ingest(source: Source, out: str | Path, *, size: tuple[int, int] | None = None, channels: int | None = None,
           split: str | None = None, test_fraction: float = 0.2, seed: int = 0, limit: int | None = None,
           skip_bad: bool = False, force: bool = False,
           progress: Callable[[int], None] | None = None,
           on_total: Callable[[int], None] | None = None,
           log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Writes `source` as a dataset at `out`; returns a summary (path, shape, classes, skipped).

    Samples are decoded one at a time and written a chunk at a time, so memory is bounded by the
    sample size, not by the number of samples; the disk and memory needed are checked against what
    is free before anything is written. Nothing appears at `out` unless the whole ingest succeeds.
    `log` receives notes for stderr (stale partials removed).
    """
    if channels not in (None, 1, 3):
        raise InputError(f"--channels must be 1 or 3, got {channels}")
    if limit is not None and limit <= 0:
        raise InputError(f"--limit must be positive, got {limit}")
    atomic.check_output(out, force, "dataset", source.paths)  # before decoding anything
    codec = source.codec or ImageCodec
    k = int(source.attributes.get("clips_per_video") or 1)  # video: a split keeps a video's clips together
    native = source.peek() if source.peek is not None else None
    if native is not None:  # a clip's size from headers: refuse a request that cannot fit before decoding it
        native = (*native[:-1], channels or native[-1])
        _check_room(out, source.count if limit is None else min(limit, source.count), native, codec, size, k)
    indices, side_groups = _indices(source, split, test_fraction, seed, limit, k)
    if on_total:
        on_total(len(indices))
    start = time.perf_counter()
    skipped: list[str] = []
    first, first_pos = _first_good(source, indices, channels, skip_bad, skipped)
    sample_shape = codec.shape(first.shape, size)
    chunk_n = min(store.chunk_rows(sample_shape, 1), len(indices))
    _check_room(out, len(indices), first.shape, codec, size, k)
    with atomic.atomic_directory(out, force, "dataset", source.paths, log) as tmp:
        rows = store.RowWriter(store.create_array(tmp / "inputs", (len(indices), *sample_shape), np.uint8,
                                                  chunk_n=chunk_n), chunk_n)

        def converted(index: int, position: int) -> np.ndarray:
            if position == first_pos:
                return codec.fit(first, size)
            return codec.fit(codec.pixels(source.read(index), channels, source.item_name(index)), size)

        kept_labels = _write_samples(source, indices[first_pos:], first_pos, converted, sample_shape, rows, skip_bad,
                                     skipped, progress)
        if source.labels is not None:
            store.write_array(tmp / "labels", np.asarray(kept_labels, np.int32))
        store.write_group(tmp, store.base_attributes(
            "dataset", modality=codec.modality, layout=codec.layout, class_names=list(source.class_names),
            source=source.description, split=split_attribute(split, test_fraction, seed, source.grouping, side_groups),
            num_samples=rows.written, skipped=skipped, **source.attributes))
    return _summary(source, out, [rows.written, *sample_shape], kept_labels, skipped, side_groups,
                    time.perf_counter() - start)


def _indices(source: Source, split: str | None, test_fraction: float, seed: int, limit: int | None,
             k: int) -> tuple[np.ndarray, list[str] | None]:
    """The samples to ingest, in order (the split's side, a video's `k` clips together, at most
    `limit`), and the groups of that side; InputError when none is left."""
    video_groups = None if source.groups is None else source.groups[::k]
    indices = split_indices(None if source.labels is None else source.labels[::k], source.count // k, split,
                            test_fraction, seed, video_groups)
    side_groups = group_names_of(video_groups, source.group_names, indices)
    indices = (indices[:, None] * k + np.arange(k)).reshape(-1)
    if limit is not None:
        indices = indices[:limit]
    if len(indices) == 0:
        raise InputError(f"{source.description}: no samples to ingest")
    return indices, side_groups


def _write_samples(source: Source, indices: np.ndarray, first_pos: int, converted: Callable[[int, int], np.ndarray],
                   sample_shape: tuple[int, ...], rows: Any, skip_bad: bool, skipped: list[str],
                   progress: Callable[[int], None] | None) -> list[int]:
    """Appends each sample of `indices` (at positions first_pos, first_pos + 1, ...) to `rows` as
    `converted` gives it; returns the labels of those kept. A sample that cannot be decoded is an
    InputError, or is skipped (named in `skipped`) with `skip_bad`; one of another shape is an InputError."""
    kept_labels: list[int] = []
    for position, index in enumerate(indices.tolist(), start=first_pos):
        name = source.item_name(index)
        try:
            image = converted(index, position)
        except BadSample as exc:
            if not skip_bad:
                raise InputError(str(exc)) from None
            skipped.append(name)
            if progress:
                progress(1)
            continue
        if image.shape != sample_shape:
            raise InputError(_mismatch(name, image.shape, sample_shape))
        rows.append(image)
        if source.labels is not None:
            kept_labels.append(int(source.labels[index]))
        if progress:
            progress(1)
    rows.finish()
    return kept_labels


def _summary(source: Source, out: str | Path, shape: list[int], kept_labels: list[int], skipped: list[str],
             side_groups: list[str] | None, seconds: float) -> dict[str, Any]:
    """What ingest reports: the dataset's path and shape, its classes, the samples skipped and padded."""
    summary: dict[str, Any] = {
        "path": store.utf8_text(str(out)),
        "shape": shape,
        "dtype": "uint8",
        "labelled": source.labels is not None,
        "num_classes": len(source.class_names) if source.labels is not None else None,
        "skipped": len(skipped),
        "seconds": round(seconds, 3),
    }
    if "padded" in source.attributes:
        summary["padded"] = len(source.attributes["padded"])
    if side_groups is not None:
        summary["groups"], summary["group_names"] = len(side_groups), side_groups
    if source.labels is not None:
        summary["label_histogram"] = np.bincount(kept_labels, minlength=len(source.class_names)).tolist()
    return summary


def _check_room(out: str | Path, count: int, native: tuple[int, ...], codec: Any, size: tuple[int, int] | None,
                clips_per_video: int = 1) -> None:
    """InputError unless `count` samples, each decoded at its own shape `native` and stored uint8 at
    `codec.shape(native, size)`, fit on the disk of `out`, and the write fits in memory: chunks of
    stored samples, decoded and stored samples (`SAMPLES_IN_MEMORY` of the larger), and the row and
    frame indices (int64, with temporaries) of the samples and of one video's clips. Disk counts the
    raw size: zstd rarely shrinks natural images much, and noise not at all."""
    sample_shape = codec.shape(native, size)
    sample_bytes = math.prod(sample_shape)
    chunk_n = min(store.chunk_rows(sample_shape, 1), count)
    frames = sample_shape[0] if codec.layout == "NTHWC" else 0
    disk = count * sample_bytes + 4 * count  # inputs + int32 labels
    memory = (CHUNKS_IN_MEMORY * chunk_n * sample_bytes + SAMPLES_IN_MEMORY * max(sample_bytes, math.prod(native))
              + INDEX_BYTES * (count + clips_per_video * frames))
    shape = "x".join(map(str, sample_shape))
    smaller = codec.smaller(size)
    resources.check_room(out, disk, memory, f"{count} samples of {shape} bytes, uncompressed; pass {smaller}, "
                     "--limit, or write to another disk", f"one sample is {shape} bytes; pass {smaller}")


def _mismatch(name: str, shape: tuple[int, ...], expected: tuple[int, ...]) -> str:
    """The error for a sample whose shape differs from the first one's, with the option that fixes it."""
    if shape[-1] != expected[-1]:
        return (f"{name}: {shape[-1]} channel(s) but the first sample has {expected[-1]}; pass --channels 1 "
                "or --channels 3 to convert every sample")
    return (f"{name}: size {list(shape)} differs from the first sample's {list(expected)}; pass --size HxW "
            "to resize")


def _first_good(source: Source, indices: np.ndarray, channels: int | None, skip_bad: bool,
                skipped: list[str]) -> tuple[np.ndarray, int]:
    """The first decodable sample at its own size (`to_pixels`) and its position in `indices`."""
    codec = source.codec or ImageCodec
    first_reason = None
    for position, index in enumerate(indices):
        name = source.item_name(int(index))
        try:
            return codec.pixels(source.read(int(index)), channels, name), position
        except BadSample as exc:
            if not skip_bad:
                raise InputError(str(exc)) from None
            skipped.append(name)
            first_reason = first_reason or str(exc)
    raise InputError(f"{source.description}: --skip-bad skipped every sample, the first because {first_reason}")
