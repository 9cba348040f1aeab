"""The Kaldi log-mel front-end (jepa_cli.data.fbank): torchaudio's outputs (golden file made by
scripts/make_fbank_golden.py with torchaudio 2.9.1) and the definitions of frames, hop and mel edges."""

import json
import math
from pathlib import Path

import jax
import numpy as np
import pytest

from jepa_cli.data.fbank import (EPSILON, FbankConfig, fbank, frame_geometry, mel_banks, mel_scale, num_frames,
                                 window_function)
from jepa_cli.errors import InputError

GOLDEN = Path(__file__).parent / "data" / "fbank_golden.npz"
CASES = ("tone", "chirp", "noise", "silence", "tiny_tone", "nosnip_noise")


def config_from_torchaudio(args: dict) -> FbankConfig:
    """FbankConfig for torchaudio.compliance.kaldi.fbank keyword arguments (its defaults otherwise)."""
    return FbankConfig(sample_rate=args["sample_frequency"], frame_length_ms=args.get("frame_length", 25.0),
                       frame_shift_ms=args.get("frame_shift", 10.0), num_bins=args.get("num_mel_bins", 23),
                       low_freq=args.get("low_freq", 20.0), high_freq=args.get("high_freq", 0.0),
                       window_type=args.get("window_type", "povey"), snip_edges=args.get("snip_edges", True))


@pytest.fixture(scope="module")
def golden():
    with np.load(GOLDEN) as f:
        return {k: f[k] for k in f.files}


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_jax_fbank_matches_torchaudio_golden(golden, name):
    args = json.loads(str(golden[f"{name}/args"]))
    wave = golden[f"{name}/wave"].astype(np.float32) / 32768.0
    expected = golden[f"{name}/fbank"]
    got = np.asarray(jax.jit(lambda w: fbank(w, config_from_torchaudio(args)))(wave))
    assert got.shape == expected.shape
    # 0.2 % of each mel energy, plus float32 rounding of the FFT (1e-8 of the clip's loudest band): bands
    # near Kaldi's floor (1.2e-7) next to loud ones differ in the log by more, in torch's float64 reference too
    e, g = np.exp(expected.astype(np.float64)), np.exp(got.astype(np.float64))
    np.testing.assert_allclose(g, e, rtol=2e-3, atol=1e-8 * e.max())
    loud = e > 1e-4 * e.max()
    np.testing.assert_allclose(got[loud], expected[loud], atol=2e-3)


@pytest.mark.slow
def test_golden_file_covers_the_audio_jepa_geometry(golden):
    args = json.loads(str(golden["tone/args"]))
    assert (args["num_mel_bins"], args["low_freq"], args["high_freq"], args["window_type"]) == (128, 20.0, 16000.0,
                                                                                              "hanning")
    assert golden["tone/fbank"].shape == (24, 128)  # 1 s at 32 kHz: 1 + (32000 - 3125) // 1250


@pytest.mark.slow
def test_silence_is_kaldis_log_floor_everywhere(golden):
    cfg = config_from_torchaudio(json.loads(str(golden["silence/args"])))
    got = np.asarray(fbank(np.zeros(32000, np.float32), cfg))
    assert np.all(got == np.float32(math.log(EPSILON)))
    assert math.log(EPSILON) == pytest.approx(-15.942385)
    np.testing.assert_array_equal(golden["silence/fbank"], got)


@pytest.mark.slow
def test_clip_shorter_than_a_window_has_no_frames(golden):
    # torchaudio refuses it outright; the JAX front-end returns zero frames
    assert "window size 3125" in str(golden["short/error"])
    cfg = config_from_torchaudio(json.loads(str(golden["short/args"])))
    wave = golden["short/wave"].astype(np.float32) / 32768.0
    assert np.asarray(fbank(wave, cfg)).shape == (0, 128)


def test_audio_jepa_geometry_in_samples():
    # 10 s / 256 frames = 39.0625 ms hop = 1250 samples at 32 kHz; window 2.5 hops = 3125 samples
    assert frame_geometry(32000, 2.5 * 10000 / 256, 10000 / 256) == (3125, 1250, 4096)
    assert num_frames(320000, 3125, 1250) == 254  # Kaldi snip_edges: 1 + (N - window) // hop
    assert num_frames(320000, 3125, 1250, snip_edges=False) == 256  # (N + hop // 2) // hop
    assert num_frames(3124, 3125, 1250) == 0
    assert num_frames(3125, 3125, 1250) == 1


def test_frame_hop_is_the_shift_in_samples():
    cfg = FbankConfig(sample_rate=1000, frame_length_ms=8, frame_shift_ms=4, num_bins=3, low_freq=0,
                      high_freq=500, window_type="rectangular", preemphasis=0.0, remove_dc_offset=False)
    # an impulse at sample 13 lies only in frames starting at 8 and 12 (window 8, hop 4): frames 2 and 3
    wave = np.zeros(40, np.float32)
    wave[13] = 1.0
    energies = np.exp(np.asarray(fbank(wave, cfg)))
    lit = np.flatnonzero(energies.max(axis=1) > 1e-3)
    assert lit.tolist() == [2, 3]


def test_mel_edges_follow_the_htk_mel_scale():
    assert mel_scale(700.0) == pytest.approx(1127.0 * math.log(2.0))
    banks = mel_banks(8, 512, 16000.0, 20.0, 8000.0)
    assert banks.shape == (8, 257)
    edges = np.linspace(mel_scale(20.0), mel_scale(8000.0), 10)  # num_bins + 2 equally spaced edges
    freqs = np.arange(257) * 16000.0 / 512
    for b in range(8):
        inside = np.flatnonzero(banks[b] > 0)
        # each filter is non-zero strictly between its left and right edges, peaking near the centre
        assert mel_scale(freqs[inside]).min() > edges[b] and mel_scale(freqs[inside]).max() < edges[b + 2]
        peak = freqs[np.argmax(banks[b])]
        assert abs(mel_scale(peak) - edges[b + 1]) < (edges[1] - edges[0])
        assert banks[b].max() <= 1.0
    assert banks[:, -1].sum() == 0.0  # the Nyquist bin has no weight


def fbank_float64(waves: np.ndarray, config: FbankConfig) -> np.ndarray:
    """fbank's steps in NumPy float64 (snip_edges only): frames, DC offset, pre-emphasis, window,
    |rfft|^2, mel banks, log."""
    window, shift, padded = config.geometry
    assert config.snip_edges
    frames = np.asarray(waves, np.float64)[..., np.arange(config.frames(waves.shape[-1]))[:, None] * shift
                                           + np.arange(window)]
    if config.remove_dc_offset:
        frames = frames - frames.mean(axis=-1, keepdims=True)
    frames = frames - config.preemphasis * np.concatenate([frames[..., :1], frames[..., :-1]], axis=-1)
    spectrum = np.abs(np.fft.rfft(frames * window_function(config.window_type, window), n=padded, axis=-1))
    spectrum = spectrum ** 2 if config.use_power else spectrum
    banks = mel_banks(config.num_bins, padded, config.sample_rate, config.low_freq, config.high_freq)
    return np.log(np.maximum(spectrum @ banks.astype(np.float64).T, EPSILON))


def test_batched_fbank_equals_per_clip_and_float64_reference():
    cfg = FbankConfig(sample_rate=8000, frame_length_ms=25, frame_shift_ms=10, num_bins=16, window_type="hanning")
    waves = np.random.default_rng(0).standard_normal((3, 2, 800)).astype(np.float32)
    batched = np.asarray(jax.jit(lambda w: fbank(w, cfg))(waves))
    assert batched.shape == (3, 2, 8, 16)  # 1 + (800 - 200) // 80
    np.testing.assert_allclose(batched[1, 0], np.asarray(fbank(waves[1, 0], cfg)), atol=1e-5)
    np.testing.assert_allclose(batched, fbank_float64(waves, cfg), atol=1e-3)


def test_mel_range_beyond_nyquist_is_refused():
    with pytest.raises(InputError, match="Nyquist"):
        FbankConfig(sample_rate=16000, high_freq=16000, num_bins=8).check()
