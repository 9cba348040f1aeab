"""`builtin:tones`: 300 synthetic audio clips in 10 classes, made at the requested sample rate with
fixed seeds, so every user gets the same set (docs/audio.md)."""

from __future__ import annotations

import math

import numpy as np

from jepa_cli.data.samples import AudioSource
from jepa_cli.errors import InputError

TONES_PER_CLASS = 30
TONES_SEED = 20250611  # fixed: builtin:tones is the same set for every user (--seed picks the split)
TONE_CLASSES = ("am-tone", "chirp-down", "chirp-up", "clicks", "harmonic", "noise-high", "noise-low",
                "pure-high", "pure-low", "two-tone")  # sorted, as class names always are


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
