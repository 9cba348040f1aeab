"""Audio-JEPA (Tuncay et al., ICME 2025), as the released LudovicTuncay/Audio-JEPA code.

Waveforms become Kaldi log-mel spectrograms [frames x mel] in JAX (jepa_cli.data.fbank), a ViT (the
same modules as I-JEPA) reads them as one-channel images cut into patches (time-major grid), random
masks with a ratio ~ U(0.4, 0.6) per batch split the patches into one context and one target set,
and the predictor regresses the EMA target encoder's features with the released code's norm_mse
loss (2 - 2 cos against per-token standardised targets). The values and their sources: docs/audio.md.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jepa_cli.data import store
from jepa_cli.data.audio import fit_length
from jepa_cli.data.fbank import fbank
from jepa_cli.data.urls import location
from jepa_cli.errors import InputError
from jepa_cli.objectives.audio_jepa_config import AudioJEPAConfig
from jepa_cli.objectives.base import EMASpec, EncoderPredictorObjective

NORM_EPS = 1e-6  # Audio-JEPA src/models/components/loss.py: target standardisation eps
# the clips the trainer reads for spec_mean and spec_std, evenly spaced over the training set: enough for
# two scalar statistics, bounded on AudioSet-size data
STATS_CLIPS = 1024
L2_FLOOR = 1e-12  # torch.nn.functional.normalize's default eps


# -- the front-end ---------------------------------------------------------------------------------

def log_mel(waves, config: AudioJEPAConfig):
    """float32 waveforms [B, samples] -> log-mel spectrograms [B, frames, mel_bins, 1]: Kaldi fbank,
    then cut or zero-padded at the end to `frames` (10 s at 32 kHz gives 254 Kaldi frames for 256; our
    choice, as AST-style loaders pad, since the reference notes do not say, docs/audio.md)."""
    x = fbank(waves, config.fbank_config)  # [B, m, mel]
    m = x.shape[-2]
    if m >= config.frames:
        x = x[..., :config.frames, :]
    else:
        x = jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, config.frames - m), (0, 0)])
    return x[..., None]


def normalise_waveform(wave: np.ndarray) -> np.ndarray:
    """Audio-JEPA's waveform normalisation: mean removed, then divided by the peak |x| (silence stays 0)."""
    x = np.asarray(wave, np.float32)
    x = x - x.mean(dtype=np.float64).astype(np.float32)
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    return x / np.float32(peak) if peak > 0 else x


def to_float(wave: np.ndarray) -> np.ndarray:
    """Stored samples as float32 (int16 scaled by 1 / 32768)."""
    wave = np.asarray(wave)
    if wave.dtype == np.int16:
        return wave.astype(np.float32) / np.float32(32768.0)
    return wave.astype(np.float32)


# -- the loss and the EMA ----------------------------------------------------------------------------

def norm_mse(pred, target, valid=None):
    """Audio-JEPA's norm_mse (src/models/components/loss.py): each target token standardised over its
    features (mean, unbiased variance, eps 1e-6), prediction and target L2-normalised (floor 1e-12),
    2 - 2 cos per token, mean over the valid tokens. pred, target [..., T, D]; valid [..., T]."""
    pred = pred.astype(jnp.float32)
    target = target.astype(jnp.float32)
    d = target.shape[-1]
    mean = jnp.mean(target, axis=-1, keepdims=True)
    var = jnp.sum(jnp.square(target - mean), axis=-1, keepdims=True) / max(d - 1, 1)
    target = (target - mean) / jnp.sqrt(var + NORM_EPS)

    def unit(x):
        return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), L2_FLOOR)

    per_token = 2.0 - 2.0 * jnp.sum(unit(pred) * unit(target), axis=-1)
    if valid is None:
        return jnp.mean(per_token)
    w = valid.astype(jnp.float32)
    return jnp.sum(per_token * w) / jnp.maximum(jnp.sum(w), 1.0)


def cosine_momentum(step, start: float, end: float, total: int | None):
    """m(s) = end - (end - start) (cos(pi s / T) + 1) / 2, held at `end` past T (constant `start` if T is 0).
    Update s (0-based) uses m(s), then the momentum advances: Audio-JEPA's on_train_batch_end order."""
    s = jnp.asarray(step, jnp.float32)
    if not total:
        return jnp.asarray(start, jnp.float32) + 0.0 * s
    progress = jnp.minimum(s, float(total)) / float(total)
    return end - (end - start) * (jnp.cos(math.pi * progress) + 1.0) / 2.0


# -- the objective ---------------------------------------------------------------------------------

class AudioJEPAObjective(EncoderPredictorObjective):
    name = "audio-jepa"
    modalities = ("audio",)

    def __init__(self, config: AudioJEPAConfig | None = None):
        self.config = config or AudioJEPAConfig()
        self.model_config = self.config.model_config

    @classmethod
    def from_config(cls, config: dict) -> "AudioJEPAObjective":
        return cls(AudioJEPAConfig.from_dict(config))

    @classmethod
    def dataset_options(cls, ds: dict) -> dict:
        """The sample rate and clip length of an audio dataset."""
        if ds.get("modality") != "audio":
            return {}
        rate = int(ds["attrs"].get("sample_rate") or 0)
        if rate <= 0:
            raise InputError("the audio dataset has no sample_rate attribute; ingest it again with jepa ingest")
        return {"sample_rate": rate, "seconds": float(ds["shape"][0]) / rate}

    def with_total_updates(self, total_updates: int) -> "AudioJEPAObjective":
        return AudioJEPAObjective(dataclasses.replace(self.config, total_updates=int(total_updates)))

    # -- parameters ------------------------------------------------------------------------
    @property
    def ema_spec(self) -> EMASpec:
        start, end = self.config.ema
        total = self.config.total_updates
        return EMASpec(source="encoder", momentum=lambda step: cosine_momentum(step, start, end, total))


    # -- training --------------------------------------------------------------------------
    def spectrogram(self, waves):
        """float32 waveforms [B, samples] -> what the encoder reads: the log-mel [B, frames, mel_bins, 1]
        (log_mel), standardised as (x - spec_mean) / (2 spec_std) with spec_norm "dataset", centred per
        clip with spec_norm "clip" (each mel bin less its mean over the frames), and with
        rectangular patches regrouped to [B, frames / patch_frames, mel_bins / patch_mels, patch_frames x
        patch_mels] (each patch's values frame-major, as a patch_frames x patch_mels convolution reads them)."""
        c = self.config
        x = log_mel(waves, c)
        if c.spec_norm == "dataset":
            if c.spec_mean is None or c.spec_std is None:
                raise InputError('spec_norm "dataset" needs spec_mean and spec_std (jepa train measures them on '
                                 "the training set)")
            x = (x - c.spec_mean) / (2.0 * c.spec_std)
        elif c.spec_norm == "clip":  # cepstral mean normalisation (Atal 1974); the log-mel's own scale is kept
            x = x - x.mean(axis=1, keepdims=True)  # [B, frames, mel_bins, 1]: each bin's mean over the frames
        if c.rectangular:
            (pt, pm), b = c.patch_shape, x.shape[0]
            x = x.reshape(b, c.frames // pt, pt, c.mel_bins // pm, pm).transpose(0, 1, 3, 2, 4)
            x = x.reshape(b, c.frames // pt, c.mel_bins // pm, pt * pm)
        return x

    def fit_to_data(self, path) -> "AudioJEPAObjective":
        """With spec_norm "dataset" and no spec_mean / spec_std given: this objective with the mean and
        std (ddof 0) of every log-mel value of the training set at `path`, the spectrogram as the encoder
        sees it before normalisation (the eval transform, padding frames included), over STATS_CLIPS clips
        evenly spaced over the set (all of a smaller one). Otherwise itself. The trainer calls it and
        records the values in run.json, so that encode-latents and the probes of the run apply the same."""
        c = self.config
        if c.spec_norm != "dataset" or (c.spec_mean is not None and c.spec_std is not None):
            return self
        inputs = store.open_array(location(path) / "inputs")
        n = int(inputs.shape[0])
        index = np.unique(np.linspace(0, n - 1, num=min(n, STATS_CLIPS)).round().astype(np.int64))
        transform, batch = self.eval_transform(), 64
        spec = jax.jit(lambda w: log_mel(w, c))
        total = total_sq = 0.0
        count = 0
        for a in range(0, len(index), batch):
            rows = [transform({"audio": np.asarray(inputs[int(i)].read().result())}, None)["audio"]
                    for i in index[a:a + batch]]
            waves = np.zeros((batch, c.clip_samples), np.float32)  # one compiled shape
            waves[:len(rows)] = np.stack(rows)
            x = np.asarray(spec(waves), np.float64)[:len(rows)]
            total += float(x.sum())
            total_sq += float(np.square(x).sum())
            count += x.size
        mean = total / count
        std = float(np.sqrt(max(total_sq / count - mean * mean, 0.0)))
        if not std > 0:
            raise InputError(f"{path}: every log-mel value is the same ({mean:g}); spec_norm \"dataset\" has no "
                             "spread to divide by")
        return AudioJEPAObjective(dataclasses.replace(c, spec_mean=mean, spec_std=std))

    def loss(self, params, ema, batch, key, step):
        spec = jax.lax.stop_gradient(self.spectrogram(batch["audio"]))
        # targets: the EMA encoder's tokens as they are; norm_mse standardises each one itself
        return self.masked_prediction(params, ema, spec, self.sample_masks(key, spec.shape[0]), key, norm_mse)

    # -- evaluation ------------------------------------------------------------------------
    def encode(self, encoder_params, waves, last_layers: int = 1):
        """[B, time patches, D * last_layers]: the encoder's tokens with the frequency patches of each
        time step mean-pooled (Audio-JEPA's downstream protocol: 16 vectors per 10 s)."""
        enc = self._encoder.merge(encoder_params)
        z = enc(self.spectrogram(waves), last_layers=last_layers).astype(jnp.float32)
        gt, gf = self.model_config.grid
        return z.reshape(z.shape[0], gt, gf, z.shape[-1]).mean(axis=2)

    def _transform(self):
        samples = self.config.clip_samples

        def transform(example: dict, rng: np.random.Generator) -> dict:
            del rng
            wave = fit_length(to_float(example["audio"]), samples, "center")
            return {**example, "audio": normalise_waveform(wave)}

        return transform

    def train_transform(self, image_size=None, on_device: bool = False):
        """No augmentation (none in the released code): centre crop or pad to the clip length, then
        the waveform normalisation (on the host whatever `on_device` says: waveforms are not pixels)."""
        return self._transform()

    def eval_transform(self, image_size=None):
        return self._transform()
