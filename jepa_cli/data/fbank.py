"""Kaldi-compatible log-mel filterbank features in JAX (torchaudio.compliance.kaldi.fbank).

Follows torchaudio's implementation step by step (torchaudio/compliance/kaldi.py, which follows
Kaldi's feat/feature-fbank.cc): frames of `window` samples every `shift` samples (snip_edges: only
frames that fit; otherwise round(N / shift) frames over a reflected signal), per-frame DC removal,
pre-emphasis 0.97, the window function, zero padding to the next power of two, |rfft|^2, triangular
mel filters on the HTK mel scale 1127 ln(1 + f / 700), and log with Kaldi's floor (float32 epsilon).
Dither is not applied (0, as in evaluation). Audio-JEPA calls it with a Hanning window, 128 bins and
20 Hz to 16 kHz (LudovicTuncay/Audio-JEPA, its spectrogram transform; docs/audio.md).

`FbankConfig` fixes the geometry (sample rate, samples per clip); `fbank(waves, config)` maps float32
waveforms [..., samples] to [..., frames, bins] and is jit-able and batched.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from jepa_cli.errors import InputError

MILLISECONDS_TO_SECONDS = 0.001  # torchaudio kaldi.py
EPSILON = float(np.finfo(np.float32).eps)  # torchaudio kaldi.py _get_epsilon: torch.finfo(float32).eps
WINDOWS = ("hanning", "hamming", "povey", "rectangular", "blackman")


def mel_scale(freq):
    """HTK mel scale, as Kaldi: 1127 ln(1 + f / 700)."""
    return 1127.0 * np.log(1.0 + np.asarray(freq, np.float64) / 700.0)


def frame_geometry(sample_rate: float, frame_length_ms: float, frame_shift_ms: float) -> tuple[int, int, int]:
    """(window, shift, padded window) in samples, with torchaudio's own arithmetic: int() of
    rate * ms * 0.001, and the window padded to the next power of two."""
    window = int(sample_rate * frame_length_ms * MILLISECONDS_TO_SECONDS)
    shift = int(sample_rate * frame_shift_ms * MILLISECONDS_TO_SECONDS)
    padded = 1 << max(0, (window - 1).bit_length())  # torchaudio _next_power_of_2
    return window, shift, padded


def num_frames(samples: int, window: int, shift: int, snip_edges: bool = True) -> int:
    """Kaldi's frame count: 1 + (N - window) // shift frames that fit (0 when N < window), or,
    without snip_edges, (N + shift // 2) // shift."""
    if snip_edges:
        return 0 if samples < window else 1 + (samples - window) // shift
    return (samples + shift // 2) // shift


def mel_banks(num_bins: int, padded_window: int, sample_rate: float, low_freq: float,
              high_freq: float) -> np.ndarray:
    """float32 [num_bins, padded_window // 2 + 1]: Kaldi's triangular filters (torchaudio
    get_mel_banks, no VTLN warping), equally spaced on the mel scale from low_freq to high_freq,
    evaluated at the FFT bins k * rate / padded_window; the Nyquist bin gets weight 0, as in Kaldi."""
    nyquist = 0.5 * sample_rate
    if high_freq <= 0.0:
        high_freq += nyquist
    if not (0.0 <= low_freq < nyquist and 0.0 < high_freq <= nyquist and low_freq < high_freq):
        raise InputError(f"mel range {low_freq:g}-{high_freq:g} Hz must lie within 0-{nyquist:g} Hz "
                         f"(the Nyquist frequency of {sample_rate:g} Hz) with low < high")
    num_fft_bins = padded_window // 2
    fft_bin_width = sample_rate / padded_window
    mel_low, mel_high = mel_scale(low_freq), mel_scale(high_freq)
    delta = (mel_high - mel_low) / (num_bins + 1)
    b = np.arange(num_bins, dtype=np.float64)[:, None]
    left, center, right = mel_low + b * delta, mel_low + (b + 1.0) * delta, mel_low + (b + 2.0) * delta
    mel = mel_scale(fft_bin_width * np.arange(num_fft_bins))[None, :]
    up = (mel - left) / (center - left)
    down = (right - mel) / (right - center)
    banks = np.maximum(0.0, np.minimum(up, down))
    return np.pad(banks, ((0, 0), (0, 1))).astype(np.float32)


def window_function(kind: str, size: int) -> np.ndarray:
    """Kaldi's windows (torchaudio _feature_window_function), symmetric (periodic=False)."""
    if kind not in WINDOWS:
        raise InputError(f"unknown window {kind!r} (choose from {', '.join(WINDOWS)})")
    n = np.arange(size, dtype=np.float64)
    denom = max(size - 1, 1)
    if kind == "hanning":
        w = 0.5 - 0.5 * np.cos(2 * math.pi * n / denom)
    elif kind == "hamming":
        w = 0.54 - 0.46 * np.cos(2 * math.pi * n / denom)
    elif kind == "povey":
        w = (0.5 - 0.5 * np.cos(2 * math.pi * n / denom)) ** 0.85
    elif kind == "rectangular":
        w = np.ones(size)
    else:  # blackman, coefficient 0.42
        a = 2 * math.pi / denom
        w = 0.42 - 0.5 * np.cos(a * n) + 0.08 * np.cos(2 * a * n)
    return w.astype(np.float32)


@dataclasses.dataclass(frozen=True)
class FbankConfig:
    """torchaudio.compliance.kaldi.fbank's arguments (its defaults unless noted) plus the clip length."""

    sample_rate: float = 32000.0  # Audio-JEPA: 32 kHz
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    num_bins: int = 23
    low_freq: float = 20.0
    high_freq: float = 0.0  # <= 0: offset from the Nyquist frequency
    window_type: str = "povey"
    preemphasis: float = 0.97
    remove_dc_offset: bool = True
    use_power: bool = True
    snip_edges: bool = True

    @property
    def geometry(self) -> tuple[int, int, int]:
        return frame_geometry(self.sample_rate, self.frame_length_ms, self.frame_shift_ms)

    def frames(self, samples: int) -> int:
        window, shift, _ = self.geometry
        return num_frames(samples, window, shift, self.snip_edges)

    def check(self) -> None:
        window, shift, padded = self.geometry
        if window < 2 or shift < 1:
            raise InputError(f"a frame of {self.frame_length_ms:g} ms every {self.frame_shift_ms:g} ms at "
                             f"{self.sample_rate:g} Hz is {window} samples every {shift}; need at least 2 and 1")
        if self.num_bins < 3:
            raise InputError(f"mel bins must be at least 3, got {self.num_bins}")
        mel_banks(self.num_bins, padded, self.sample_rate, self.low_freq, self.high_freq)
        window_function(self.window_type, 2)


@functools.lru_cache(maxsize=32)
def _constants(config: FbankConfig):
    config.check()
    window, shift, padded = config.geometry
    return (window_function(config.window_type, window),
            mel_banks(config.num_bins, padded, config.sample_rate, config.low_freq, config.high_freq))


def fbank(waves, config: FbankConfig):
    """Log mel energies float32 [..., frames, num_bins] of float32 waveforms [..., samples].

    Pure JAX (jit-able, batched over the leading axes); `frames` = config.frames(samples), which may be
    0 for a clip shorter than one window (snip_edges)."""
    import jax.numpy as jnp

    window_fn, banks = _constants(config)
    window, shift, padded = config.geometry
    x = jnp.asarray(waves, jnp.float32)
    n = x.shape[-1]
    m = config.frames(n)
    if not config.snip_edges:  # torchaudio _get_strided: reflect at both ends
        pad = window // 2 - shift // 2
        rev = jnp.flip(x, axis=-1)
        if pad > 0:
            x = jnp.concatenate([rev[..., n - pad:], x, rev], axis=-1)
        else:
            x = jnp.concatenate([x[..., -pad:], rev], axis=-1)
    index = np.arange(m)[:, None] * shift + np.arange(window)[None, :]  # [m, window]
    frames = x[..., index]  # [..., m, window]
    if config.remove_dc_offset:
        frames = frames - jnp.mean(frames, axis=-1, keepdims=True)
    if config.preemphasis != 0.0:
        previous = jnp.concatenate([frames[..., :1], frames[..., :-1]], axis=-1)  # replicate-padded shift
        frames = frames - config.preemphasis * previous
    frames = frames * jnp.asarray(window_fn)
    spectrum = jnp.abs(jnp.fft.rfft(frames, n=padded, axis=-1))
    if config.use_power:
        spectrum = spectrum * spectrum
    energies = jnp.einsum("...f,bf->...b", spectrum, jnp.asarray(banks),
                          precision="highest")
    return jnp.log(jnp.maximum(energies, EPSILON))
