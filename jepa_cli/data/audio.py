"""Audio for `jepa ingest`: folders of wav/flac/ogg and the writer (decoding: audio_decode.py,
`builtin:tones`: tones.py).

A clip is decoded to float32, mixed down to mono (mean of the channels), resampled with soxr to the
dataset's sample rate and cropped or zero-padded to `seconds` (docs/formats.md, "Audio datasets").
Clips are decoded in parallel threads (libsndfile and soxr release the GIL) and written in order, a
chunk at a time, so memory does not grow with the number of clips. Waveform normalisation (mean
removed, peak normalised) is not stored: objectives apply it when they load a clip.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jepa_cli.data import atomic, folders, labels, resources, store
from jepa_cli.data.audio_decode import decode_file
from jepa_cli.data.folders import AUDIO_EXTENSIONS
from jepa_cli.data.sources import BadSample
from jepa_cli.data.splits import group_names_of, split_attribute, split_indices
from jepa_cli.data.store import utf8_text
from jepa_cli.errors import InputError

DEFAULT_SAMPLE_RATE = 32000  # Audio-JEPA trains at 32 kHz (LudovicTuncay/Audio-JEPA)
DEFAULT_SECONDS = 10.0  # Audio-JEPA's 10 s clips
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 1000, 384000
MAX_CLIP_SAMPLES = 1 << 26  # 64 Mi samples (35 minutes at 32 kHz) per clip: 256 MiB of float32


@dataclass
class AudioSource:
    """Clips with labels known up front; `read(i)` decodes one: (float32 [samples] mono at
    `sample_rate`, its original duration in seconds); BadSample when it cannot."""

    description: str
    count: int
    read: Callable[[int, int], tuple[np.ndarray, float]]  # (index, sample_rate) -> (mono wave, seconds)
    item_name: Callable[[int], str]
    labels: np.ndarray | None = None
    class_names: list[str] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)
    groups: np.ndarray | None = None  # int32 [count], indices into group_names: what --split keeps together
    group_names: list[str] = field(default_factory=list)
    grouping: dict[str, Any] | None = None  # how the groups were found (data/labels.py Naming.provenance)


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
        from jepa_cli.data.tones import tones_source

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
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise InputError(f"--seconds must be a positive number, got {seconds}")
    if not MIN_SAMPLE_RATE <= int(sample_rate) <= MAX_SAMPLE_RATE:
        raise InputError(f"--sample-rate must lie in {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz, got {sample_rate}")
    samples = int(round(seconds * sample_rate))
    if samples < 1 or samples > MAX_CLIP_SAMPLES:
        raise InputError(f"--seconds {seconds:g} at {sample_rate} Hz gives {seconds * sample_rate:.6g} samples per clip; "
                         f"the limit is 1..{MAX_CLIP_SAMPLES}")
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
    disk = len(indices) * (samples * 4 + 8)  # inputs + int32 labels + float32 durations
    workers = max(1, int(workers or os.cpu_count() or 1))
    memory = (8 * chunk_n + 4 * workers) * samples * 4
    resources.check_room(out, disk, memory, f"{len(indices)} clips of {samples} float32 samples; pass a smaller "
                     "--seconds or --sample-rate, --limit, or write to another disk",
                     f"one clip is {samples} samples; pass a smaller --seconds")
    train_crop = split == "train"

    def load(index: int) -> tuple[np.ndarray, float]:
        wave, duration = source.read(index, int(sample_rate))
        if train_crop and wave.shape[0] > samples:
            offset = int(np.random.default_rng([seed, index]).integers(0, wave.shape[0] - samples + 1))
        else:
            offset = "center"
        return fit_length(wave, samples, offset), duration

    skipped: list[str] = []
    first_reason = None  # why the first skipped clip was skipped, for the error when every clip is
    kept_labels: list[int] = []
    durations: list[float] = []
    with atomic.atomic_directory(out, force, "dataset", source.paths, log) as tmp:
        rows = store.RowWriter(store.create_array(tmp / "inputs", (len(indices), samples), np.float32,
                                                  chunk_n=chunk_n), chunk_n)
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            window = 4 * workers
            pending: list[tuple[int, concurrent.futures.Future]] = []
            order = iter(int(i) for i in indices)
            exhausted = False
            while pending or not exhausted:
                while not exhausted and len(pending) < window:
                    try:
                        index = next(order)
                    except StopIteration:
                        exhausted = True
                        break
                    pending.append((index, pool.submit(load, index)))
                if not pending:
                    break
                index, future = pending.pop(0)
                try:
                    wave, duration = future.result()
                except BadSample as exc:
                    if not skip_bad:
                        for _, other in pending:
                            other.cancel()
                        raise InputError(str(exc)) from None
                    skipped.append(source.item_name(index))
                    first_reason = first_reason or str(exc)
                    if progress:
                        progress(1)
                    continue
                rows.append(wave)
                durations.append(round(float(duration), 6))
                if source.labels is not None:
                    kept_labels.append(int(source.labels[index]))
                if progress:
                    progress(1)
        rows.finish()
        written = rows.written
        if written == 0:
            raise InputError(f"{source.description}: every clip was unreadable, the first because {first_reason}")
        if source.labels is not None:
            store.write_array(tmp / "labels", np.asarray(kept_labels, np.int32))
        store.write_array(tmp / "durations", np.asarray(durations, np.float32))
        attributes = store.base_attributes(
            "dataset", modality="audio", layout="NS", class_names=list(source.class_names),
            source=source.description,
            split=split_attribute(split, test_fraction, seed, source.grouping, side_groups),
            num_samples=written, skipped=skipped, sample_rate=int(sample_rate), seconds=float(seconds),
            crop="random" if train_crop else "center",
        )
        store.write_group(tmp, attributes)
    summary: dict[str, Any] = {
        "path": utf8_text(str(out)),
        "shape": [written, samples],
        "dtype": "float32",
        "sample_rate": int(sample_rate),
        "clip_seconds": float(seconds),
        "labelled": source.labels is not None,
        "num_classes": len(source.class_names) if source.labels is not None else None,
        "skipped": len(skipped),
        "duration_seconds": duration_stats(np.asarray(durations)),
        "seconds": round(time.perf_counter() - start, 3),
    }
    if side_groups is not None:
        summary["groups"], summary["group_names"] = len(side_groups), side_groups
    if source.labels is not None:
        summary["label_histogram"] = np.bincount(kept_labels, minlength=len(source.class_names)).tolist()
    return summary


def duration_stats(durations: np.ndarray) -> dict[str, float]:
    """min, mean, median, max and total of clip durations in seconds."""
    d = np.asarray(durations, np.float64)
    if d.size == 0:
        return {}
    return {"min": round(float(d.min()), 3), "mean": round(float(d.mean()), 3),
            "median": round(float(np.median(d)), 3), "max": round(float(d.max()), 3),
            "total": round(float(d.sum()), 3)}
