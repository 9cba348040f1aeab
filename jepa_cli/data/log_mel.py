"""The raw-audio features of `jepa probe --raw`: Kaldi log-mel spectrograms of normalised clips
(docs/formats.md, "Audio datasets")."""

from __future__ import annotations

from typing import Any

import numpy as np

from jepa_cli.data.fbank import FbankConfig, fbank
from jepa_cli.errors import InputError

RAW_MEL_BINS = 128  # Audio-JEPA's mel bins
RAW_FRAME_MS, RAW_SHIFT_MS = 25.0, 10.0  # Kaldi's standard framing (torchaudio's defaults)


def raw_fbank_config(sample_rate: int) -> Any:
    """The front-end of the raw baseline: 128 mel bins from 20 Hz to min(16 kHz, Nyquist), Hanning,
    25 ms frames every 10 ms."""
    return FbankConfig(sample_rate=float(sample_rate), frame_length_ms=RAW_FRAME_MS, frame_shift_ms=RAW_SHIFT_MS,
                       num_bins=RAW_MEL_BINS, low_freq=20.0, high_freq=min(16000.0, sample_rate / 2.0),
                       window_type="hanning")


def pooled_log_mel(waves: np.ndarray, sample_rate: int, batch: int = 64) -> np.ndarray:
    """The raw-audio baseline of `jepa probe --raw`: each clip normalised as the objectives do (mean
    removed, peak 1), Kaldi log-mel (`raw_fbank_config`), averaged over time: float32 [N, 128]."""
    import jax

    config = raw_fbank_config(sample_rate)
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
