"""Audio for `jepa ingest`: folders of wav/flac/ogg and the writer (decoding: audio_decode.py,
`builtin:tones`: tones.py).

A clip is decoded to float32, mixed down to mono (mean of the channels), resampled with soxr to the
dataset's sample rate and cropped or zero-padded to `seconds` (docs/formats.md, "Audio datasets").
Clips are decoded in parallel threads (libsndfile and soxr release the GIL) and written in order, a
chunk at a time, so memory does not grow with the number of clips. Waveform normalisation (mean
removed, peak normalised) is not stored: objectives apply it when they load a clip.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from jepa_cli.data import atomic, folders, labels, resources, store
from jepa_cli.data.audio_decode import decode_file
from jepa_cli.data.folders import AUDIO_EXTENSIONS
from jepa_cli.data.samples import AudioSource, BadSample
from jepa_cli.data.splits import group_names_of, split_attribute, split_indices
from jepa_cli.data.store import utf8_text
from jepa_cli.data.tones import tones_source
from jepa_cli.errors import InputError

DEFAULT_SAMPLE_RATE = 32000  # Audio-JEPA trains at 32 kHz (LudovicTuncay/Audio-JEPA)
DEFAULT_SECONDS = 10.0  # Audio-JEPA's 10 s clips
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 1000, 384000
MAX_CLIP_SAMPLES = 1 << 26  # 64 Mi samples (35 minutes at 32 kHz) per clip: 256 MiB of float32


def is_audio_source(spec: str) -> bool:
    """`builtin:tones`, an audio file (refused by open_audio_source with the fix), or a folder holding
    audio files at any depth; InputError for a folder that holds images or videos too
    (folders.folder_holds_audio)."""
    if spec == "builtin:tones":
        return True
    path = Path(spec)
    if path.is_file() and path.suffix.lower() in AUDIO_EXTENSIONS:
        return True
    return path.is_dir() and folders.folder_holds_audio(path)


# -- sources ---------------------------------------------------------------------------------------

def open_audio_source(spec: str, labels_csv: str | None = None, label_regex: str | None = None,
                      group_regex: str | None = None, group_column: str | None = None) -> AudioSource:
    """`builtin:tones` or a folder of audio files; labels from class sub-folders, a CSV (path,label;
    paths relative to the folder) or a regex over the file stems; groups for --split from a regex over
    the paths or a CSV column (data/labels.py)."""
    if spec == "builtin:tones":
        if labels_csv or label_regex or group_regex or group_column:
            raise InputError("--labels, --label-regex, --group-regex and --group-column do not apply to a builtin: "
                             "source")
        return tones_source()
    root = Path(spec)
    if root.is_file():
        raise InputError(utf8_text(f"{root}: is one audio file; ingest the folder that holds it"))
    if not root.is_dir():
        raise InputError(f"{root}: no such folder")
    naming = labels.Naming(labels_csv, label_regex, group_regex, group_column)
    files = folders.walk_files(root, AUDIO_EXTENSIONS)
    if not files:
        raise InputError(f"{utf8_text(str(root))}: no audio files found ({', '.join(sorted(AUDIO_EXTENSIONS))})")
    paths = [root] + ([Path(labels_csv)] if labels_csv else [])
    by_folder = None if naming.relabels else labels.folder_labels(root, files, "files")
    named = labels.name_items(root, files, naming, "audio files", by_folder)
    label_ids, class_names = labels.class_ids(named.labels)
    group_ids, group_names = labels.class_ids(named.groups)

    def read(i: int, sample_rate: int) -> tuple[np.ndarray, float]:
        return decode_file(files[i], sample_rate)

    return AudioSource(utf8_text(str(root)), len(files), read, lambda i: utf8_text(str(files[i])), label_ids,
                       class_names, paths, group_ids, group_names, naming.provenance() if naming.grouped else None)


def fit_length(wave: np.ndarray, samples: int, offset: str | int = "center") -> np.ndarray:
    """Cropped (at `offset`: "center", or a start index) or zero-padded at the end to `samples`."""
    n = wave.shape[0]
    if n >= samples:
        start = (n - samples) // 2 if offset == "center" else int(offset)
        return wave[start:start + samples]
    return np.concatenate([wave, np.zeros(samples - n, np.float32)])


# -- the writer ------------------------------------------------------------------------------------

def ingest_audio(source: AudioSource, out: str | Path, *, sample_rate: int = DEFAULT_SAMPLE_RATE,
                 seconds: float = DEFAULT_SECONDS, split: str | None = None, test_fraction: float = 0.2,
                 seed: int = 0, limit: int | None = None, skip_bad: bool = False, force: bool = False,
                 workers: int | None = None, progress: Callable[[int], None] | None = None,
                 on_total: Callable[[int], None] | None = None,
                 log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Writes `source` as an audio dataset at `out` (float32 [N, samples]); returns a summary.

    Crops: `--split train` takes a random window of each longer clip (seeded by `seed` and the clip's
    index), every other ingest the centre window. Nothing appears at `out` unless the whole ingest
    succeeds."""
    samples = _clip_samples(seconds, sample_rate)
    if limit is not None and limit <= 0:
        raise InputError(f"--limit must be positive, got {limit}")
    atomic.check_output(out, force, "dataset", source.paths)
    indices = split_indices(source.labels, source.count, split, test_fraction, seed, source.groups)
    side_groups = group_names_of(source.groups, source.group_names, indices)
    if limit is not None:
        indices = indices[:limit]
    if len(indices) == 0:
        raise InputError(f"{source.description}: no samples to ingest")
    if on_total:
        on_total(len(indices))
    start = time.perf_counter()
    chunk_n = min(store.chunk_rows((samples,), 4), len(indices))
    workers = max(1, int(workers or os.cpu_count() or 1))
    _check_audio_room(out, len(indices), samples, chunk_n, workers)
    train_crop = split == "train"

    def load(index: int) -> tuple[np.ndarray, float]:
        wave, duration = source.read(index, int(sample_rate))
        if train_crop and wave.shape[0] > samples:
            offset = int(np.random.default_rng([seed, index]).integers(0, wave.shape[0] - samples + 1))
        else:
            offset = "center"
        return fit_length(wave, samples, offset), duration

    with atomic.atomic_directory(out, force, "dataset", source.paths, log) as tmp:
        rows = store.RowWriter(store.create_array(tmp / "inputs", (len(indices), samples), np.float32,
                                                  chunk_n=chunk_n), chunk_n)
        with contextlib.closing(decoded_in_order(load, [int(i) for i in indices], workers)) as decoded:
            kept = _write_clips(source, decoded, rows, skip_bad, progress)
        if source.labels is not None:
            store.write_array(tmp / "labels", np.asarray(kept.labels, np.int32))
        store.write_array(tmp / "durations", np.asarray(kept.durations, np.float32))
        store.write_group(tmp, store.base_attributes(
            "dataset", modality="audio", layout="NS", class_names=list(source.class_names),
            source=source.description,
            split=split_attribute(split, test_fraction, seed, source.grouping, side_groups),
            num_samples=kept.written, skipped=kept.skipped, sample_rate=int(sample_rate), seconds=float(seconds),
            crop="random" if train_crop else "center",
        ))
    summary = {"path": utf8_text(str(out)), "shape": [kept.written, samples], "dtype": "float32",
               "sample_rate": int(sample_rate), "clip_seconds": float(seconds)}
    return summary | _kept_summary(source, kept, side_groups, time.perf_counter() - start)


def _clip_samples(seconds: float, sample_rate: int) -> int:
    """Samples in one clip of `seconds` at `sample_rate` Hz; InputError for settings out of range."""
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise InputError(f"--seconds must be a positive number, got {seconds}")
    if not MIN_SAMPLE_RATE <= int(sample_rate) <= MAX_SAMPLE_RATE:
        raise InputError(f"--sample-rate must lie in {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz, got {sample_rate}")
    samples = int(round(seconds * sample_rate))
    if samples < 1 or samples > MAX_CLIP_SAMPLES:
        raise InputError(f"--seconds {seconds:g} at {sample_rate} Hz gives {seconds * sample_rate:.6g} samples per clip; "
                         f"the limit is 1..{MAX_CLIP_SAMPLES}")
    return samples


def _check_audio_room(out: str | Path, count: int, samples: int, chunk_n: int, workers: int) -> None:
    """InputError unless `count` clips of `samples` float32 fit on the disk of `out` (with an int32
    label and a float32 duration each), and in memory: 8 write chunks and 4 clips per worker."""
    disk = count * (samples * 4 + 8)  # inputs + int32 labels + float32 durations
    memory = (8 * chunk_n + 4 * workers) * samples * 4
    resources.check_room(out, disk, memory, f"{count} clips of {samples} float32 samples; pass a smaller "
                         "--seconds or --sample-rate, --limit, or write to another disk",
                         f"one clip is {samples} samples; pass a smaller --seconds")


def decoded_in_order(load: Callable[[int], Any], indices: list[int],
                     workers: int) -> Iterator[tuple[int, concurrent.futures.Future]]:
    """(index, future of `load(index)`) for each of `indices`, in their order, decoded by `workers`
    threads at most 4 x `workers` clips ahead of the consumer, so memory holds a bounded number of
    clips whatever their count. Closing the iterator cancels the clips not started."""
    window = 4 * workers
    pending: collections.deque[tuple[int, concurrent.futures.Future]] = collections.deque()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        try:
            for index in indices:
                pending.append((index, pool.submit(load, index)))
                if len(pending) >= window:
                    yield pending.popleft()
            while pending:
                yield pending.popleft()
        finally:
            for _, future in pending:
                future.cancel()


@dataclass
class _Kept:
    """What the writer kept: the rows written, each kept clip's duration (s) and label, the skipped clips."""

    written: int = 0
    durations: list[float] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _write_clips(source: AudioSource, decoded: Iterator[tuple[int, concurrent.futures.Future]], rows: Any,
                 skip_bad: bool, progress: Callable[[int], None] | None) -> _Kept:
    """Appends each decoded clip to `rows` in order; a clip that cannot be decoded is an InputError,
    or skipped with `skip_bad` (InputError when every clip is)."""
    kept, first_reason = _Kept(), None  # why the first skipped clip was skipped, for the error when every clip is
    for index, future in decoded:
        try:
            wave, duration = future.result()
        except BadSample as exc:
            if not skip_bad:
                raise InputError(str(exc)) from None
            kept.skipped.append(source.item_name(index))
            first_reason = first_reason or str(exc)
        else:
            rows.append(wave)
            kept.durations.append(round(float(duration), 6))
            if source.labels is not None:
                kept.labels.append(int(source.labels[index]))
        if progress:
            progress(1)
    rows.finish()
    kept.written = rows.written
    if kept.written == 0:
        raise InputError(f"{source.description}: every clip was unreadable, the first because {first_reason}")
    return kept


def _kept_summary(source: AudioSource, kept: _Kept, side_groups: list[str] | None, seconds: float) -> dict[str, Any]:
    """The summary's counts: labels, skipped clips, durations, groups of the split, time taken."""
    summary: dict[str, Any] = {
        "labelled": source.labels is not None,
        "num_classes": len(source.class_names) if source.labels is not None else None,
        "skipped": len(kept.skipped),
        "duration_seconds": duration_stats(np.asarray(kept.durations)),
        "seconds": round(seconds, 3),
    }
    if side_groups is not None:
        summary["groups"], summary["group_names"] = len(side_groups), side_groups
    if source.labels is not None:
        summary["label_histogram"] = np.bincount(kept.labels, minlength=len(source.class_names)).tolist()
    return summary


def duration_stats(durations: np.ndarray) -> dict[str, float]:
    """min, mean, median, max and total of clip durations in seconds."""
    d = np.asarray(durations, np.float64)
    if d.size == 0:
        return {}
    return {"min": round(float(d.min()), 3), "mean": round(float(d.mean()), 3),
            "median": round(float(np.median(d)), 3), "max": round(float(d.max()), 3),
            "total": round(float(d.sum()), 3)}
