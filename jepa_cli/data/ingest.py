"""`jepa ingest`: stream a `Source` into a dataset directory (docs/formats.md), atomically."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jepa_cli.data import store
from jepa_cli.data.sources import BadSample, Source
from jepa_cli.errors import InputError

GRAY_MODES = {"1", "L", "LA", "I", "I;16", "F"}  # Pillow modes kept as one channel by default


def split_indices(labels: np.ndarray | None, count: int, split: str | None, test_fraction: float,
                  seed: int) -> np.ndarray:
    """Sorted sample indices of a deterministic stratified split (all indices when `split` is None).

    Within each class a permutation from `default_rng(seed)` sends the first round(n_c * F) samples
    to `test`; `train` gets the rest, so the two splits are disjoint and cover the source.
    """
    if split is None:
        return np.arange(count)
    if split not in ("train", "test"):
        raise InputError(f"--split must be train or test, got {split!r}")
    if not 0.0 < test_fraction < 1.0:
        raise InputError(f"--test-fraction must lie in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    groups = labels if labels is not None else np.zeros(count, np.int32)
    test = np.zeros(count, bool)
    for value in np.unique(groups):
        members = np.flatnonzero(groups == value)
        chosen = rng.permutation(members)[: int(round(len(members) * test_fraction))]
        test[chosen] = True
    return np.flatnonzero(test if split == "test" else ~test)


def to_image(sample: Any, size: tuple[int, int] | None, channels: int | None) -> np.ndarray:
    """One decoded sample as uint8 [H, W, C]: channels converted, resized with a center crop to `size`."""
    from PIL import Image, ImageOps

    if isinstance(sample, np.ndarray):
        if sample.ndim == 3 and sample.shape[-1] == 1:
            sample = sample[..., 0]  # [H, W]: Pillow's mode L
        native_channels = 1 if sample.ndim == 2 else sample.shape[-1]
        if size is None and native_channels in (1, 3) and channels in (None, native_channels):
            return sample[..., None] if sample.ndim == 2 else sample  # nothing to convert: skip Pillow
        sample = Image.fromarray(sample)
    mode = {1: "L", 3: "RGB"}.get(channels or 0) or ("L" if sample.mode in GRAY_MODES else "RGB")
    if sample.mode != mode:
        sample = sample.convert(mode)
    if size is not None and (sample.height, sample.width) != tuple(size):
        sample = ImageOps.fit(sample, (size[1], size[0]), method=Image.Resampling.BICUBIC)
    array = np.asarray(sample, dtype=np.uint8)
    return array[..., None] if array.ndim == 2 else array


def ingest(source: Source, out: str | Path, *, size: tuple[int, int] | None = None, channels: int | None = None,
           split: str | None = None, test_fraction: float = 0.2, seed: int = 0, limit: int | None = None,
           skip_bad: bool = False, force: bool = False,
           progress: Callable[[int], None] | None = None,
           on_total: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Writes `source` as a dataset at `out`; returns a summary (path, shape, classes, skipped).

    Samples are decoded one at a time and written a chunk at a time. Nothing appears at `out`
    unless the whole ingest succeeds.
    """
    if channels not in (None, 1, 3):
        raise InputError(f"--channels must be 1 or 3, got {channels}")
    if limit is not None and limit <= 0:
        raise InputError(f"--limit must be positive, got {limit}")
    indices = split_indices(source.labels, source.count, split, test_fraction, seed)
    if limit is not None:
        indices = indices[:limit]
    if len(indices) == 0:
        raise InputError(f"{source.description}: no samples to ingest")
    if on_total:
        on_total(len(indices))
    start = time.perf_counter()
    skipped: list[str] = []
    with store.atomic_directory(out, force) as tmp:
        first, first_pos = _first_good(source, indices, size, channels, skip_bad, skipped)
        sample_shape = first.shape
        inputs = store.create_array(tmp / "inputs", (len(indices), *sample_shape), np.uint8)
        chunk_n = inputs.chunk_layout.write_chunk.shape[0]
        buffer = np.empty((chunk_n, *sample_shape), np.uint8)
        kept_labels: list[int] = []
        written = filled = 0
        for position in range(first_pos, len(indices)):
            index = int(indices[position])
            if position == first_pos:
                image = first
            else:
                try:
                    image = to_image(source.read(index), size, channels)
                except BadSample as exc:
                    if not skip_bad:
                        raise InputError(str(exc)) from None
                    skipped.append(source.item_name(index))
                    if progress:
                        progress(1)
                    continue
            if image.shape != sample_shape:
                raise InputError(f"{source.item_name(index)}: size {list(image.shape)} differs from the first "
                                 f"sample's {list(sample_shape)}; pass --size HxW to resize")
            buffer[filled] = image
            filled += 1
            if source.labels is not None:
                kept_labels.append(int(source.labels[index]))
            if filled == chunk_n:
                inputs[written:written + filled].write(buffer[:filled]).result()
                written += filled
                filled = 0
            if progress:
                progress(1)
        if filled:
            inputs[written:written + filled].write(buffer[:filled]).result()
            written += filled
        if written != len(indices):
            inputs = store.resize_first_axis(inputs, written)
        if source.labels is not None:
            store.write_array(tmp / "labels", np.asarray(kept_labels, np.int32))
        attributes = store.base_attributes(
            "dataset",
            modality="image",
            layout="NHWC",
            class_names=list(source.class_names),
            source=source.description,
            split=None if split is None else {"name": split, "test_fraction": test_fraction, "seed": seed},
            num_samples=written,
            skipped=skipped,
        )
        store.write_group(tmp, attributes)
    summary: dict[str, Any] = {
        "path": str(out),
        "shape": [written, *sample_shape],
        "dtype": "uint8",
        "labelled": source.labels is not None,
        "num_classes": len(source.class_names) if source.labels is not None else None,
        "skipped": len(skipped),
        "seconds": round(time.perf_counter() - start, 3),
    }
    if source.labels is not None:
        summary["label_histogram"] = np.bincount(kept_labels, minlength=len(source.class_names)).tolist()
    return summary


def _first_good(source: Source, indices: np.ndarray, size, channels, skip_bad: bool,
                skipped: list[str]) -> tuple[np.ndarray, int]:
    for position, index in enumerate(indices):
        try:
            return to_image(source.read(int(index)), size, channels), position
        except BadSample as exc:
            if not skip_bad:
                raise InputError(str(exc)) from None
            skipped.append(source.item_name(int(index)))
    raise InputError(f"{source.description}: every sample was unreadable")
