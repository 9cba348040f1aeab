"""Writes tests/data/fbank_golden.npz: torchaudio.compliance.kaldi.fbank outputs for a few signals.

Run once with a separate environment that has torchaudio (it is not a dependency of jepa-cli):
    python3.11 -m venv /tmp/venv-torchaudio && /tmp/venv-torchaudio/bin/pip install torch==2.9.1 'torchaudio==2.9.*' numpy
    /tmp/venv-torchaudio/bin/python scripts/make_fbank_golden.py tests/data/fbank_golden.npz

Signals are quantised to 16 bits (k / 32768, exact in float32) and stored as int16, so the file stays
small and both sides read bit-identical inputs. Each case `NAME` stores `NAME/wave` (int16),
`NAME/fbank` (float32 [frames, bins]), `NAME/args` (JSON of the fbank keyword arguments) and
`NAME/error` (what torchaudio raised, or ""; it refuses a clip shorter than one window).
"""

from __future__ import annotations

import json
import sys

import numpy as np

# Audio-JEPA's front-end (LudovicTuncay/Audio-JEPA): 32 kHz, 10 s / 256 frames -> shift 39.0625 ms,
# window 2.5 shifts, Hanning, 128 bins, 20 Hz - 16 kHz, dither 0.
AUDIO_JEPA = dict(sample_frequency=32000.0, frame_shift=10000.0 / 256, frame_length=2.5 * 10000.0 / 256,
                  num_mel_bins=128, low_freq=20.0, high_freq=16000.0, window_type="hanning", dither=0.0,
                  htk_compat=True, use_energy=False)
# The tiny recipe's front-end: 16 kHz, 1 s / 64 frames, 32 bins up to 8 kHz.
TINY = dict(sample_frequency=16000.0, frame_shift=1000.0 / 64, frame_length=2.5 * 1000.0 / 64,
            num_mel_bins=32, low_freq=20.0, high_freq=8000.0, window_type="hanning", dither=0.0,
            htk_compat=True, use_energy=False)
# torchaudio's defaults otherwise (povey window, 25 ms / 10 ms, 23 bins), without snip_edges.
DEFAULTS_NO_SNIP = dict(sample_frequency=16000.0, dither=0.0, snip_edges=False)


def quantise(x: np.ndarray) -> np.ndarray:
    return np.clip(np.round(x * 32768.0), -32768, 32767).astype(np.int16)


def signals() -> dict[str, tuple[np.ndarray, dict]]:
    rng = np.random.default_rng(0)
    t32 = np.arange(32000) / 32000.0
    t16 = np.arange(16000) / 16000.0
    chirp = np.sin(2 * np.pi * (100.0 * t32 + 0.5 * (12000.0 - 100.0) * t32**2))
    return {
        "tone": (quantise(0.5 * np.sin(2 * np.pi * 440.0 * t32 + 0.3)), AUDIO_JEPA),
        "chirp": (quantise(0.5 * chirp), AUDIO_JEPA),
        "noise": (quantise(0.3 * rng.standard_normal(32000)), AUDIO_JEPA),
        "silence": (np.zeros(32000, np.int16), AUDIO_JEPA),
        "short": (quantise(0.5 * np.sin(2 * np.pi * 1000.0 * t32[:1600])), AUDIO_JEPA),  # shorter than a window
        "tiny_tone": (quantise(0.4 * np.sin(2 * np.pi * 660.0 * t16) + 0.05 * rng.standard_normal(16000)), TINY),
        "nosnip_noise": (quantise(0.2 * rng.standard_normal(4000)), DEFAULTS_NO_SNIP),
    }


def main(out: str) -> None:
    import torch
    import torchaudio
    from torchaudio.compliance import kaldi

    arrays: dict[str, np.ndarray] = {}
    for name, (wave, args) in signals().items():
        x = torch.from_numpy(wave.astype(np.float32) / 32768.0)[None]
        error = ""
        try:
            feats = kaldi.fbank(x, **args).numpy().astype(np.float32)
        except Exception as exc:  # noqa: BLE001 - record what torchaudio does with a too-short clip
            error = f"{type(exc).__name__}: {exc}"
            print(f"{name}: torchaudio raised {error}")
            feats = np.zeros((0, args.get("num_mel_bins", 23)), np.float32)
        arrays[f"{name}/error"] = np.asarray(error)
        arrays[f"{name}/wave"] = wave
        arrays[f"{name}/fbank"] = feats
        arrays[f"{name}/args"] = np.asarray(json.dumps(args))
        print(name, feats.shape)
    arrays["versions"] = np.asarray(json.dumps({"torch": torch.__version__, "torchaudio": torchaudio.__version__}))
    np.savez_compressed(out, **arrays)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/fbank_golden.npz")
