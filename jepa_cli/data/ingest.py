"""`jepa ingest`: stream a `Source` into a dataset directory (docs/formats.md), atomically."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jepa_cli.data import atomic, resources, store
from jepa_cli.data.sources import BadSample, Source, to_uint8
from jepa_cli.data.splits import group_names_of, split_attribute, split_indices
from jepa_cli.errors import InputError

# Pillow modes a folder of images can hold, by how their pixels become uint8 (docs/formats.md):
EIGHT_BIT_MODES = {"1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "HSV"}
WIDE_MODES = {"I;16", "I;16L", "I;16B", "I;16N", "I", "F"}  # one channel of 16-bit, 32-bit or float values
GRAY_MODES = {"1", "L", "LA"} | WIDE_MODES  # kept as one channel by default
# Peak memory of one ingest above the process's own, in units of the write chunk (the buffer,
# TensorStore's copies, the zstd output) and of one sample (decoded, converted, Pillow's 4-byte
# pixels while resizing). Measured peaks (RssAnon): 27 MiB with 4 MiB chunks of small samples
# (the same for 2,000 and 40,000 samples), 7.3-9.6 samples when a chunk holds one sample.
CHUNKS_IN_MEMORY, SAMPLES_IN_MEMORY = 8, 6
INDEX_BYTES = 24  # per sample and per frame of a clip: an int64 index and two temporaries while it is computed


def to_pixels(sample: Any, channels: int | None, name: str) -> np.ndarray:
    """A PIL image or an array as uint8 [H, W, C] at its own size; C is `channels`, else 1 for
    gray modes and 3 for colour ones.

    16-bit and float images are scaled by their real range (`to_uint8`), never clipped: Pillow's own
    conversion to L saturates 16-bit values and truncates floats in [0, 1] to 0.
    """
    from PIL import Image

    if not isinstance(sample, np.ndarray):
        if sample.mode in WIDE_MODES:
            sample = _wide_pixels(sample, name)
        elif sample.mode not in EIGHT_BIT_MODES:
            raise BadSample(f"{name}: Pillow mode {sample.mode} is not supported; convert it to RGB or grayscale")
    if isinstance(sample, np.ndarray):
        if sample.ndim == 3 and sample.shape[-1] == 1:
            sample = sample[..., 0]  # [H, W]: Pillow's mode L
        native_channels = 1 if sample.ndim == 2 else sample.shape[-1]
        if native_channels in (1, 3) and channels in (None, native_channels):
            return sample[..., None] if sample.ndim == 2 else sample  # nothing to convert: skip Pillow
        sample = Image.fromarray(sample)
    mode = {1: "L", 3: "RGB"}.get(channels or 0) or ("L" if sample.mode in GRAY_MODES else "RGB")
    if sample.mode != mode:
        sample = sample.convert(mode)
    array = np.asarray(sample, dtype=np.uint8)
    return array[..., None] if array.ndim == 2 else array


def _wide_pixels(image: Any, name: str) -> np.ndarray:
    """uint8 [H, W] of a 16-bit (I;16*), 32-bit integer (I) or float (F) Pillow image.

    Mode I holds 16-bit files too (16-bit PGM): its values must lie in [0, 65535] and are scaled as
    16-bit; F must lie in [0, 1]."""
    values = np.asarray(image)
    if image.mode == "I":
        if values.size and (values.min() < 0 or values.max() > 65535):
            raise BadSample(f"{name}: 32-bit integer pixels outside [0, 65535] (min {values.min()}, max "
                            f"{values.max()}); save it as 8-bit or 16-bit")
        values = values.astype(np.uint16)
    return to_uint8(values, name)


def fit(image: np.ndarray, size: tuple[int, int] | None) -> np.ndarray:
    """uint8 [H, W, C] resized (bicubic) with a center crop to `size` = (H', W'); as is if None."""
    if size is None or image.shape[:2] == tuple(size):
        return image
    from PIL import Image, ImageOps

    picture = Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)
    array = np.asarray(ImageOps.fit(picture, (size[1], size[0]), method=Image.Resampling.BICUBIC), np.uint8)
    return array[..., None] if array.ndim == 2 else array


class ImageCodec:
    """How ingest converts an image source's samples (a video source brings video.ClipCodec)."""

    modality = "image"
    layout = "NHWC"
    pixels = staticmethod(lambda sample, channels, name: to_pixels(sample, channels, name))
    fit = staticmethod(lambda image, size: fit(image, size))

    @staticmethod
    def shape(native: tuple[int, ...], size: tuple[int, int] | None) -> tuple[int, ...]:
        """The stored shape [H, W, C] of a sample whose own shape is `native`."""
        return (*(size or native[:2]), native[2])

    @staticmethod
    def smaller(size: tuple[int, int] | None) -> str:
        """The options that shrink a sample, for a refusal's hint."""
        return f"a --size smaller than {size[0]}x{size[1]}" if size else "a smaller --size"


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
    video_groups = None if source.groups is None else source.groups[::k]
    indices = split_indices(None if source.labels is None else source.labels[::k], source.count // k, split,
                            test_fraction, seed, video_groups)
    side_groups = group_names_of(video_groups, source.group_names, indices)
    indices = (indices[:, None] * k + np.arange(k)).reshape(-1)
    if limit is not None:
        indices = indices[:limit]
    if len(indices) == 0:
        raise InputError(f"{source.description}: no samples to ingest")
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
        kept_labels: list[int] = []
        for position in range(first_pos, len(indices)):
            index = int(indices[position])
            name = source.item_name(index)
            try:
                image = (codec.fit(first, size) if position == first_pos
                         else codec.fit(codec.pixels(source.read(index), channels, name), size))
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
        written = rows.written
        if source.labels is not None:
            store.write_array(tmp / "labels", np.asarray(kept_labels, np.int32))
        attributes = store.base_attributes(
            "dataset",
            modality=codec.modality,
            layout=codec.layout,
            class_names=list(source.class_names),
            source=source.description,
            split=split_attribute(split, test_fraction, seed, source.grouping, side_groups),
            num_samples=written,
            skipped=skipped,
            **source.attributes,
        )
        store.write_group(tmp, attributes)
    summary: dict[str, Any] = {
        "path": store.utf8_text(str(out)),
        "shape": [written, *sample_shape],
        "dtype": "uint8",
        "labelled": source.labels is not None,
        "num_classes": len(source.class_names) if source.labels is not None else None,
        "skipped": len(skipped),
        "seconds": round(time.perf_counter() - start, 3),
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
