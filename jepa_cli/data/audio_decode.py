"""Decoding one audio file for `jepa ingest`: float32 mono at the dataset's rate, with the checks that
turn a truncated or oversized file into a BadSample naming it (docs/formats.md, "Audio datasets")."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np

from jepa_cli.data import resources
from jepa_cli.data.samples import BadSample
from jepa_cli.data.store import utf8_text


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
