"""Audio for `jepa ingest`: folders of wav/flac/ogg (soundfile), `builtin:tones`, and the writer.

A clip is decoded to float32, mixed down to mono (mean of the channels), resampled with soxr to the
dataset's sample rate and cropped or zero-padded to `seconds` (docs/formats.md, "Audio datasets").
Clips are decoded in parallel threads (libsndfile and soxr release the GIL) and written in order, a
chunk at a time, so memory does not grow with the number of clips. Waveform normalisation (mean
removed, peak normalised) is not stored: objectives apply it when they load a clip.
"""

from __future__ import annotations

import concurrent.futures
import csv
import math
import os
import re
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jepa_cli.data import atomic, folders, resources, store
from jepa_cli.data.folders import AUDIO_EXTENSIONS
from jepa_cli.data.ingest import split_indices
from jepa_cli.data.sources import BadSample
from jepa_cli.data.store import utf8_text
from jepa_cli.errors import InputError

DEFAULT_SAMPLE_RATE = 32000  # Audio-JEPA trains at 32 kHz (LudovicTuncay/Audio-JEPA)
DEFAULT_SECONDS = 10.0  # Audio-JEPA's 10 s clips
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 1000, 384000
MAX_CLIP_SAMPLES = 1 << 26  # 64 Mi samples (35 minutes at 32 kHz) per clip: 256 MiB of float32
TONES_PER_CLASS = 30
TONES_SEED = 20250611  # fixed: builtin:tones is the same set for every user (--seed picks the split)
TONE_CLASSES = ("am-tone", "chirp-down", "chirp-up", "clicks", "harmonic", "noise-high", "noise-low",
                "pure-high", "pure-low", "two-tone")  # sorted, as class names always are


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

def open_audio_source(spec: str, labels_csv: str | None = None, label_regex: str | None = None) -> AudioSource:
    """`builtin:tones` or a folder of audio files; labels from class sub-folders, a CSV (path,label;
    paths relative to the folder) or a regex over the file stems (its first group)."""
    if spec == "builtin:tones":
        if labels_csv or label_regex:
            raise InputError("--labels and --label-regex do not apply to a builtin: source")
        return tones_source()
    root = Path(spec)
    if root.is_file():
        raise InputError(utf8_text(f"{root}: is one audio file; ingest the folder that holds it"))
    if not root.is_dir():
        raise InputError(f"{root}: no such folder")
    if labels_csv and label_regex:
        raise InputError("give --labels or --label-regex, not both")
    files = folders.walk_files(root, AUDIO_EXTENSIONS)
    if not files:
        raise InputError(f"{utf8_text(str(root))}: no audio files found ({', '.join(sorted(AUDIO_EXTENSIONS))})")
    paths = [root]
    if labels_csv:
        names = _csv_labels(root, files, Path(labels_csv))
        paths.append(Path(labels_csv))
    elif label_regex:
        names = _regex_labels(files, label_regex)
    else:
        names = _folder_labels(root, files)
    labels, class_names = None, []
    if names is not None:
        class_names = sorted(set(names))
        lookup = {name: i for i, name in enumerate(class_names)}
        labels = np.asarray([lookup[n] for n in names], np.int32)

    def read(i: int, sample_rate: int) -> tuple[np.ndarray, float]:
        return decode_file(files[i], sample_rate)

    return AudioSource(utf8_text(str(root)), len(files), read, lambda i: utf8_text(str(files[i])), labels,
                       utf8_text(class_names), paths)


def _folder_labels(root: Path, files: list[Path]) -> list[str] | None:
    """The top-level folder of each file, or None when every file lies directly in `root`."""
    nested = [len(f.relative_to(root).parts) > 1 for f in files]
    if not any(nested):
        return None
    loose = next((f for f, n in zip(files, nested) if not n), None)
    if loose is not None:
        raise InputError(utf8_text(f"{loose}: lies outside the class folders of {root} (move it into one, or "
                                   "label the files with --labels or --label-regex)"))
    return [f.relative_to(root).parts[0] for f in files]


def _csv_labels(root: Path, files: list[Path], csv_path: Path) -> list[str]:
    """The label of each of `files` from a `path,label` CSV (paths relative to `root`, an optional
    header). Read as UTF-8 with or without the byte-order mark spreadsheets write; a path named twice
    is an InputError giving both line numbers."""
    if not csv_path.is_file():
        raise InputError(f"{csv_path}: no such labels file")
    rows: list[tuple[int, list[str]]] = []  # (line number where the row starts, cells)
    try:
        with open(csv_path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle)
            line = 1
            for row in reader:
                if row and any(c.strip() for c in row):
                    rows.append((line, row))
                line = reader.line_num + 1
    except (UnicodeDecodeError, csv.Error) as exc:
        raise InputError(f"{csv_path}: not a UTF-8 CSV file of path,label rows ({exc})") from None
    if rows and [c.strip().lower() for c in rows[0][1]] == ["path", "label"]:
        rows = rows[1:]
    by_path: dict[str, str] = {}
    line_of: dict[str, int] = {}
    for line, row in rows:
        if len(row) != 2 or not row[0].strip() or not row[1].strip():
            raise InputError(f"{csv_path}: line {line} is not 'path,label': {','.join(row)[:80]!r}")
        key = Path(row[0].strip()).as_posix()
        if key in line_of:
            raise InputError(utf8_text(f"{csv_path}: names {key!r} twice, on lines {line_of[key]} and {line}; "
                                       "give each file one label"))
        by_path[key], line_of[key] = row[1].strip(), line
    known = {f.relative_to(root).as_posix() for f in files}
    missing = sorted(set(by_path) - known)
    if missing:
        raise InputError(f"{csv_path}: names {len(missing)} file(s) that are not audio files in {root}, "
                         f"first {missing[0]!r}")
    unlabelled = [f for f in files if f.relative_to(root).as_posix() not in by_path]
    if unlabelled:
        raise InputError(utf8_text(f"{csv_path}: has no label for {len(unlabelled)} audio file(s) of {root}, "
                                   f"first {unlabelled[0].relative_to(root).as_posix()!r}"))
    return [by_path[f.relative_to(root).as_posix()] for f in files]


def _regex_labels(files: list[Path], pattern: str) -> list[str]:
    """The label of each file from `re.search(pattern, stem)`: the first group that took part in the
    match, or the whole match when no group did (or the regex has none). A file the regex does not
    match, or whose label is empty, is an InputError."""
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise InputError(f"--label-regex {pattern!r} is not a valid regular expression ({exc})") from None
    names: list[str | None] = []
    for f in files:
        m = regex.search(f.stem)
        label = None if m is None else next((g for g in m.groups() if g is not None), m.group(0))
        names.append(label or None)
    missed = [f for f, name in zip(files, names) if name is None]
    if len(missed) == len(files):
        raise InputError(utf8_text(f"--label-regex {pattern!r} matches none of the {len(files)} file names, "
                                   f"e.g. {files[0].stem!r}"))
    if missed:
        raise InputError(utf8_text(f"--label-regex {pattern!r} gives no label for {len(missed)} file(s), "
                                   f"first {missed[0]}"))
    return names  # type: ignore[return-value]


def decode_file(path: Path, sample_rate: int) -> tuple[np.ndarray, float]:
    """float32 mono at `sample_rate` and the original duration; BadSample naming the file."""
    import soundfile as sf

    name = utf8_text(str(path))
    _check_wav_length(path, name)
    _check_decode_memory(path, name, sample_rate)
    try:
        data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except Exception as exc:  # noqa: BLE001 - libsndfile reports corrupt files in several ways
        raise BadSample(f"{name}: cannot decode audio ({' '.join(str(exc).split())[:160]})") from None
    if data.shape[0] == 0:
        raise BadSample(f"{name}: holds no audio samples")
    if not np.isfinite(data).all():
        raise BadSample(f"{name}: holds NaN or infinite samples")
    mono = data.mean(axis=1, dtype=np.float32) if data.shape[1] > 1 else data[:, 0]
    try:
        return resample(mono, rate, sample_rate), data.shape[0] / float(rate)
    except MemoryError:  # the check above reckons with what was available then; other processes take memory too
        raise BadSample(f"{name}: ran out of memory resampling {data.shape[0]} samples from {rate} Hz to "
                        f"{sample_rate} Hz") from None


def _check_decode_memory(path: Path, name: str, sample_rate: int) -> None:
    """BadSample naming the file when decoding it and resampling the whole of it to `sample_rate` needs
    more memory than is available, reckoned from its header before a sample is read (float32: the
    decoded channels, their mono mix, and soxr's output and its copy). A header may claim billions of
    samples, or a rate of 1 Hz that turns a short file into billions of samples at 32 kHz."""
    import soundfile as sf

    try:
        info = sf.info(str(path))
    except Exception:  # noqa: BLE001 - an unreadable header: sf.read says why
        return
    frames, channels, rate = int(info.frames), int(info.channels), int(info.samplerate)
    if rate <= 0 or frames <= 0:
        return
    need = 4 * (frames * (channels + 1) + 2 * math.ceil(frames * sample_rate / rate))
    free = resources.available_memory()
    if free is not None and need > free:
        raise BadSample(f"{name}: needs about {resources.format_bytes(need)} of memory to decode ({frames} samples x "
                        f"{channels} channel(s) at {rate} Hz, resampled to {sample_rate} Hz) but "
                        f"{resources.format_bytes(free)} is available")


def _check_wav_length(path: Path, name: str) -> None:
    """A WAV file whose data chunk is cut short: libsndfile reads what is there without a word, so
    the RIFF header is compared with the file's size."""
    if path.suffix.lower() != ".wav":
        return
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            header = handle.read(12)
            if len(header) < 12 or header[:4] != b"RIFF" or header[8:12] != b"WAVE":
                return  # not RIFF/WAVE: libsndfile's own error names it
            offset = 12
            while offset + 8 <= size:
                handle.seek(offset)
                chunk, length = struct.unpack("<4sI", handle.read(8))
                if chunk == b"data":
                    if length not in (0, 0xFFFFFFFF) and offset + 8 + length > size:
                        raise BadSample(f"{name}: truncated WAV file (its header announces {length} bytes of "
                                        f"audio, {size - offset - 8} follow)")
                    return
                offset += 8 + length + (length & 1)
    except OSError as exc:
        raise BadSample(f"{name}: cannot read ({exc})") from None


def resample(wave: np.ndarray, rate: int | float, target: int) -> np.ndarray:
    """Band-limited resampling with soxr (its 'HQ' quality); float32 in and out."""
    if int(rate) == int(target):
        return np.ascontiguousarray(wave, np.float32)
    import soxr

    return np.asarray(soxr.resample(wave, float(rate), float(target), quality="HQ"), np.float32)


def fit_length(wave: np.ndarray, samples: int, offset: str | int = "center") -> np.ndarray:
    """Cropped (at `offset`: "center", or a start index) or zero-padded at the end to `samples`."""
    n = wave.shape[0]
    if n >= samples:
        start = (n - samples) // 2 if offset == "center" else int(offset)
        return wave[start:start + samples]
    return np.concatenate([wave, np.zeros(samples - n, np.float32)])


# -- builtin:tones ---------------------------------------------------------------------------------

def tones_source() -> AudioSource:
    """10 classes x 30 synthetic clips of 1-2 s, made at the requested sample rate (docs/audio.md)."""
    count = len(TONE_CLASSES) * TONES_PER_CLASS
    labels = np.repeat(np.arange(len(TONE_CLASSES), dtype=np.int32), TONES_PER_CLASS)

    def read(i: int, sample_rate: int) -> tuple[np.ndarray, float]:
        wave = synth_tone(TONE_CLASSES[labels[i]], sample_rate, np.random.default_rng([TONES_SEED, i]))
        return wave, wave.shape[0] / float(sample_rate)

    return AudioSource("builtin:tones", count, read, lambda i: f"builtin:tones[{i}]", labels, list(TONE_CLASSES))


def _band_noise(rng: np.random.Generator, n: int, sr: int, lo: float, hi: float) -> np.ndarray:
    spectrum = np.fft.rfft(rng.standard_normal(n))
    freqs = np.fft.rfftfreq(n, 1.0 / sr)
    spectrum[(freqs < lo) | (freqs > hi)] = 0.0
    return np.fft.irfft(spectrum, n)


def synth_tone(kind: str, sr: int, rng: np.random.Generator) -> np.ndarray:
    """One clip of class `kind`: random duration (1-2 s), pitch, phase, level and background noise."""
    n = int(round(rng.uniform(1.0, 2.0) * sr))
    t = np.arange(n) / float(sr)
    top = 0.45 * sr  # every component stays below the Nyquist frequency
    phase = rng.uniform(0, 2 * math.pi)
    scale = min(1.0, top / 5000.0)  # pitches shrink with low sample rates so classes stay apart

    def sine(f, ph=phase):
        return np.sin(2 * math.pi * f * t + ph)

    if kind == "pure-low":
        x = sine(rng.uniform(200, 400) * scale)
    elif kind == "pure-high":
        x = sine(rng.uniform(1500, 3000) * scale)
    elif kind == "two-tone":
        f = rng.uniform(300, 600) * scale
        x = 0.5 * sine(f) + 0.5 * sine(1.5 * f, rng.uniform(0, 2 * math.pi))
    elif kind == "harmonic":
        f0 = rng.uniform(120, 250) * scale
        x = sum(sine(k * f0, rng.uniform(0, 2 * math.pi)) / k for k in range(1, 9) if k * f0 < top)
    elif kind in ("chirp-up", "chirp-down"):
        f_lo, f_hi = rng.uniform(200, 400) * scale, rng.uniform(2500, 4500) * scale
        f_start, f_end = (f_lo, f_hi) if kind == "chirp-up" else (f_hi, f_lo)
        k = (f_end / f_start) ** (1.0 / t[-1])  # exponential sweep over the clip
        x = np.sin(2 * math.pi * f_start * (k**t - 1.0) / math.log(k) + phase)
    elif kind == "am-tone":
        x = sine(rng.uniform(600, 1200) * scale) * (1.0 + 0.9 * np.sin(2 * math.pi * rng.uniform(3, 8) * t)) / 1.9
    elif kind == "noise-low":
        x = _band_noise(rng, n, sr, 100 * scale, 800 * scale)
    elif kind == "noise-high":
        x = _band_noise(rng, n, sr, 2500 * scale, 4500 * scale)
    elif kind == "clicks":
        x = np.zeros(n)
        period = int(sr / rng.uniform(5, 15))
        burst = np.exp(-np.arange(int(0.01 * sr)) / (0.002 * sr)) * np.sin(
            2 * math.pi * 1000 * scale * np.arange(int(0.01 * sr)) / sr)
        for start in range(int(rng.integers(0, period)), n - len(burst), period):
            x[start:start + len(burst)] += burst
    else:
        raise InputError(f"unknown tone class {kind!r}")
    x = np.asarray(x, np.float64)
    snr_db = rng.uniform(10, 30)  # white background noise 10-30 dB below the signal
    x = x + rng.standard_normal(n) * np.sqrt(np.mean(x**2) / 10 ** (snr_db / 10))
    return (x / max(np.max(np.abs(x)), 1e-9) * rng.uniform(0.1, 0.9)).astype(np.float32)  # random peak level


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
    indices = split_indices(source.labels, source.count, split, test_fraction, seed)
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
            split=None if split is None else {"name": split, "test_fraction": test_fraction, "seed": seed},
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


# -- raw baseline features -------------------------------------------------------------------------

RAW_MEL_BINS = 128  # Audio-JEPA's mel bins
RAW_FRAME_MS, RAW_SHIFT_MS = 25.0, 10.0  # Kaldi's standard framing (torchaudio's defaults)


def pooled_log_mel(waves: np.ndarray, sample_rate: int, batch: int = 64) -> np.ndarray:
    """The raw-audio baseline of `jepa probe --raw`: each clip normalised as the objectives do (mean
    removed, peak 1), Kaldi log-mel (128 bins from 20 Hz to min(16 kHz, Nyquist), Hanning, 25 ms
    frames every 10 ms), averaged over time: float32 [N, 128]."""
    import jax

    from jepa_cli.data.fbank import FbankConfig, fbank

    config = FbankConfig(sample_rate=float(sample_rate), frame_length_ms=RAW_FRAME_MS, frame_shift_ms=RAW_SHIFT_MS,
                         num_bins=RAW_MEL_BINS, low_freq=20.0, high_freq=min(16000.0, sample_rate / 2.0),
                         window_type="hanning")
    waves = np.asarray(waves)
    if config.frames(waves.shape[-1]) == 0:
        raise InputError(f"clips of {waves.shape[-1]} samples are shorter than one 25 ms frame at {sample_rate} Hz")
    step = jax.jit(lambda w: fbank(w, config).mean(axis=-2))
    scale = np.float32(1 / 32768.0) if waves.dtype == np.int16 else np.float32(1.0)
    out = []
    for a in range(0, len(waves), batch):
        x = waves[a:a + batch].astype(np.float32) * scale
        x = x - x.mean(axis=1, keepdims=True)
        peak = np.abs(x).max(axis=1, keepdims=True)
        x = np.where(peak > 0, x / np.where(peak > 0, peak, 1.0), x)
        rows = len(x)
        if rows < batch:  # one compiled shape
            x = np.concatenate([x, np.zeros((batch - rows, x.shape[1]), np.float32)])
        out.append(np.asarray(step(x))[:rows])
    return np.concatenate(out).astype(np.float32)


# -- pictures --------------------------------------------------------------------------------------

PICTURE_RANGE = 80.0 * math.log(10.0) / 10.0  # 80 dB of power, in natural-log units (18.4)
PICTURE_GAP = 2  # pixels between two spectrograms


def spectrogram_png(dataset: str | Path, png_path: str | Path, samples: int = 4, force: bool = False) -> dict[str, Any]:
    """Draws the log-mel spectrograms of an audio dataset's first `samples` clips, one under the
    other (time left to right, low frequencies at the bottom, the loudest 80 dB of each clip from
    black to white), the front-end of `pooled_log_mel` without the time average; written atomically
    as a PNG (`force` replaces only a PNG). Returns {"png", "samples", "frames", "mel_bins"}."""
    import io

    import jax
    from PIL import Image

    from jepa_cli.data.fbank import FbankConfig, fbank

    dataset = Path(dataset)
    attrs = store.read_attributes(dataset)
    if attrs.get("modality") != "audio":
        raise InputError(f"{dataset}: --png draws audio datasets (spectrograms); this one holds "
                         f"{attrs.get('modality')!r}")
    if samples < 1:
        raise InputError(f"--samples must be positive, got {samples}")
    atomic.check_output_file(png_path, force, atomic.PNG_MAGIC, "PNG picture")
    atomic.check_disjoint(png_path, [dataset])
    inputs = store.open_array(dataset / "inputs")
    clips = np.asarray(store.read(inputs, slice(0, min(samples, int(inputs.shape[0])))))
    if clips.dtype == np.int16:
        clips = clips.astype(np.float32) / np.float32(32768.0)
    rate = int(attrs.get("sample_rate") or 0)
    if rate <= 0:
        raise InputError(f"{dataset}: has no sample_rate attribute; ingest it again")
    config = FbankConfig(sample_rate=float(rate), frame_length_ms=RAW_FRAME_MS, frame_shift_ms=RAW_SHIFT_MS,
                         num_bins=RAW_MEL_BINS, low_freq=20.0, high_freq=min(16000.0, rate / 2.0),
                         window_type="hanning")
    if config.frames(clips.shape[-1]) == 0:
        raise InputError(f"{dataset}: clips of {clips.shape[-1]} samples are shorter than one 25 ms frame")
    spec = np.asarray(jax.jit(lambda w: fbank(w, config))(clips.astype(np.float32)))  # [n, frames, bins]
    top = spec.max(axis=(1, 2), keepdims=True)
    level = np.clip((spec - (top - PICTURE_RANGE)) / PICTURE_RANGE, 0.0, 1.0)
    tiles = [np.round(255 * level[i].T[::-1]).astype(np.uint8) for i in range(len(level))]  # [bins, frames]
    gap = np.full((PICTURE_GAP, tiles[0].shape[1]), 128, np.uint8)
    picture = np.concatenate([part for tile in tiles for part in (tile, gap)][:-1], axis=0)
    buffer = io.BytesIO()
    Image.fromarray(picture, "L").save(buffer, format="PNG")
    atomic.write_file(png_path, buffer.getvalue(), force, atomic.PNG_MAGIC, "PNG picture")
    return {"png": utf8_text(str(png_path)), "samples": len(tiles), "frames": int(spec.shape[1]),
            "mel_bins": RAW_MEL_BINS}
