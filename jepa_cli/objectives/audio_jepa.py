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

import jax
import jax.numpy as jnp
import numpy as np

from jepa_cli.data.fbank import FbankConfig, fbank
from jepa_cli.errors import InputError
from jepa_cli.fieldtypes import check_field_types
from jepa_cli.masks.config import RandomConfig
from jepa_cli.models import ModelConfig
from jepa_cli.models.config import MODEL_SIZES
from jepa_cli.models.mixer_pattern import SSM_STEP
from jepa_cli.models.vit import gather_tokens
from jepa_cli.objectives import telemetry
from jepa_cli.objectives.base import EMASpec, EncoderPredictorObjective
from jepa_cli.objectives.ijepa_config import IJEPAConfig, check_anticollapse
from jepa_cli.options import option, option_of

NORM_EPS = 1e-6  # Audio-JEPA src/models/components/loss.py: target standardisation eps
SPEC_NORMS = ("none", "dataset", "clip")
# the clips the trainer reads for spec_mean and spec_std, evenly spaced over the training set: enough for
# two scalar statistics, bounded on AudioSet-size data
STATS_CLIPS = 1024
L2_FLOOR = 1e-12  # torch.nn.functional.normalize's default eps


def _tuplify(v):
    return tuple(_tuplify(x) for x in v) if isinstance(v, list) else v


def _listify(v):
    return [_listify(x) for x in v] if isinstance(v, tuple) else v


@dataclasses.dataclass(frozen=True)
class AudioJEPAConfig:
    """The model, the front-end, the masks and the EMA; defaults are Audio-JEPA's values."""

    # model (jepa_cli.models.ModelConfig's options; image size and channels follow from the front-end)
    model: str = option_of(ModelConfig, "model", "base")  # Audio-JEPA: ViT-B 768/12/12
    patch_size: int = option_of(ModelConfig, "patch_size", 16)  # Audio-JEPA: 16 x 16 patches over (time, mel)
    pred_depth: int = option_of(ModelConfig, "pred_depth", 6)  # Audio-JEPA predictor depth 6
    pred_width: int = option_of(ModelConfig, "pred_width", 384)  # Audio-JEPA predictor width 384
    pred_heads: int | None = option_of(ModelConfig, "pred_heads", 12)  # Audio-JEPA predictor 12 heads
    dtype: str = option_of(ModelConfig, "dtype", "float32")
    width: int | None = option_of(ModelConfig, "width", None)
    depth: int | None = option_of(ModelConfig, "depth", None)
    heads: int | None = option_of(ModelConfig, "heads", None)
    mlp_ratio: float | None = option_of(ModelConfig, "mlp_ratio", None)
    scan_layers: bool = option_of(ModelConfig, "scan_layers", False)
    remat: str = option_of(ModelConfig, "remat", "none")
    mixer: str = option_of(ModelConfig, "mixer", "attn")
    pred_mixer: str = option_of(ModelConfig, "pred_mixer", "")
    ssm_state: int = option_of(ModelConfig, "ssm_state", 64)
    ssm_step: tuple[float, float] = option_of(ModelConfig, "ssm_step", SSM_STEP)
    scan_order: str = option_of(ModelConfig, "scan_order", "raster")
    ssm_gaps: str = option_of(ModelConfig, "ssm_gaps", "skip")
    # Audio-JEPA configs/model/jepa.yaml leaves norm_layer at torch's nn.LayerNorm: eps 1e-5
    norm_eps: float = option_of(ModelConfig, "norm_eps", 1e-5)
    # front-end (Kaldi fbank as torchaudio.compliance.kaldi.fbank)
    sample_rate: int = option(32000, "Sample rate in Hz (training takes the dataset's).")  # Audio-JEPA: 32 kHz
    seconds: float = option(10.0, "Clip length in seconds (training takes the dataset's).")  # Audio-JEPA: 10 s clips
    mel_bins: int = option(128, "Mel filterbank channels (the spectrogram's height).")  # Audio-JEPA: 128 mel bins
    # Audio-JEPA: 256 frames per clip; the hop is seconds / frames (39.06 ms at 10 s)
    frames: int = option(256, "Spectrogram frames per clip; the hop is seconds / frames.")
    window_hops: float = option(2.5, "Analysis window length in hops.")  # Audio-JEPA: window 2.5 hops
    window: str = option("hanning", "Analysis window type (Kaldi's names).")  # Audio-JEPA: window_type hanning
    fmin: float = option(20.0, "Lowest mel filter edge in Hz.")  # Audio-JEPA: low_freq 20 Hz
    # Audio-JEPA: high_freq 16 kHz
    fmax: float = option(16000.0, "Highest mel filter edge in Hz (capped at the data's Nyquist frequency).")
    # patches of another shape than patch_size x patch_size (not in Audio-JEPA): time strips across every
    # mel bin (patch_mels = mel_bins) as in speech models, or any (frames, mel bins) rectangle
    patch_frames: int | None = option(None, "Patch height in spectrogram frames (default: patch_size).")
    patch_mels: int | None = option(None, "Patch width in mel bins (default: patch_size; mel_bins: time strips).")
    # input normalisation (not in Audio-JEPA, which uses none): AudioMAE and BEATs standardise the log-mel
    # with dataset statistics as (x - mean) / (2 std) (AudioMAE dataset.py, BEATs.py preprocess)
    spec_norm: str = option("none", "Log-mel input normalisation: none (Audio-JEPA) | dataset: (x - spec_mean) / "
                                    "(2 spec_std), the training set's statistics (AudioMAE, BEATs) | clip: each mel "
                                    "bin less its mean over the clip's frames (cepstral mean normalisation: the "
                                    "recording's spectral envelope, its speaker and channel, removed).",
                            choices=SPEC_NORMS)
    spec_mean: float | None = option(None, "Mean of the training set's log-mel values (spec_norm dataset; default: "
                                           "computed by the trainer and recorded in run.json).")
    spec_std: float | None = option(None, "Std of the training set's log-mel values (spec_norm dataset; default: "
                                          "computed by the trainer and recorded in run.json).")
    # masks (jepa_cli.masks.RandomConfig); Audio-JEPA jepa_module.py: mask ratio ~ U(0.4, 0.6) per batch
    ratio: tuple[float, float] = option_of(RandomConfig, "ratio", (0.4, 0.6))
    # EMA: cosine ramp over the run (Audio-JEPA's EMA callback)
    ema: tuple[float, float] = option((0.996, 1.0), "Target-encoder EMA momentum START,END, a cosine ramp over "
                                                    "the run.")
    total_updates: int | None = option(None, "EMA ramp length in updates (default: set by the trainer).")
    # anti-collapse terms, off in Audio-JEPA (declared with I-JEPA's options)
    var_weight: float = option_of(IJEPAConfig, "var_weight", 0.0)
    var_target: float = option_of(IJEPAConfig, "var_target", 1.0)
    cov_weight: float = option_of(IJEPAConfig, "cov_weight", 0.0)
    sigreg_weight: float = option_of(IJEPAConfig, "sigreg_weight", 0.0)
    sigreg_slices: int = option_of(IJEPAConfig, "sigreg_slices", 256)
    sigreg_knots: int = option_of(IJEPAConfig, "sigreg_knots", 17)
    sigreg_t_max: float = option_of(IJEPAConfig, "sigreg_t_max", 3.0)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _tuplify(getattr(self, f.name)))
        check_field_types(self, "audio-jepa")
        check_anticollapse(self)
        if self.sample_rate <= 0 or self.seconds <= 0:
            raise InputError(f"sample_rate and seconds must be positive, got {self.sample_rate} and {self.seconds}")
        if self.frames <= 0 or self.mel_bins < 3 or self.window_hops <= 0:
            raise InputError("frames must be >= 1, mel_bins >= 3 and window_hops > 0")
        lo, hi = self.ratio
        if not 0.0 <= lo <= hi < 1.0:
            raise InputError(f"ratio must be two fractions 0 <= lo <= hi < 1, got {list(self.ratio)}")
        if len(self.ema) != 2 or not all(0.0 <= m <= 1.0 for m in self.ema):
            raise InputError(f"ema must be two momenta in [0, 1], got {self.ema!r}")
        if self.total_updates is not None and self.total_updates < 0:
            raise InputError(f"total_updates must be >= 0, got {self.total_updates}")
        if self.spec_norm not in SPEC_NORMS:
            raise InputError(f"unknown spec_norm {self.spec_norm!r} (choose from {', '.join(SPEC_NORMS)})")
        if self.spec_norm != "dataset" and (self.spec_mean is not None or self.spec_std is not None):
            raise InputError('spec_mean and spec_std apply to spec_norm = "dataset"')
        if (self.spec_mean is None) != (self.spec_std is None):
            raise InputError("spec_mean and spec_std go together: give both or neither")
        if self.spec_std is not None and not self.spec_std > 0:
            raise InputError(f"spec_std must be > 0, got {self.spec_std!r}")
        for name in ("patch_frames", "patch_mels"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise InputError(f"{name} must be >= 1, got {getattr(self, name)}")
        pt, pm = self.patch_shape
        if self.rectangular and (self.frames % pt or self.mel_bins % pm):
            raise InputError(f"patches of {pt} frames x {pm} mel bins do not tile {self.frames} frames x "
                             f"{self.mel_bins} mel bins (patch_frames, patch_mels)")
        if self.model not in MODEL_SIZES:
            raise InputError(f"unknown model size {self.model!r} (choose from {', '.join(MODEL_SIZES)})")
        self.fbank_config.check()
        if self.fbank_config.frames(self.clip_samples) == 0:
            raise InputError(f"a clip of {self.clip_samples} samples is shorter than one window "
                             f"({self.fbank_config.geometry[0]} samples); use fewer frames or longer clips")
        _ = self.model_config  # validates the model fields (patch grid, widths, heads)

    @property
    def clip_samples(self) -> int:
        return int(round(self.seconds * self.sample_rate))

    @property
    def hop_ms(self) -> float:
        return self.seconds * 1000.0 / self.frames

    @property
    def fbank_config(self) -> FbankConfig:
        nyquist = self.sample_rate / 2.0
        return FbankConfig(sample_rate=float(self.sample_rate), frame_length_ms=self.window_hops * self.hop_ms,
                           frame_shift_ms=self.hop_ms, num_bins=self.mel_bins, low_freq=float(self.fmin),
                           high_freq=float(min(self.fmax, nyquist)), window_type=self.window)

    @property
    def patch_shape(self) -> tuple[int, int]:
        """(frames, mel bins) of one patch."""
        return (self.patch_frames or self.patch_size, self.patch_mels or self.patch_size)

    @property
    def rectangular(self) -> bool:
        """Whether the patches are not patch_size squares: the spectrogram is then regrouped into one
        channel per value of a patch and read with 1 x 1 patches (the same linear patch embedding)."""
        return self.patch_shape != (self.patch_size, self.patch_size)

    @property
    def model_config(self) -> ModelConfig:
        if self.rectangular:
            pt, pm = self.patch_shape
            image_size, channels, patch_size = (self.frames // pt, self.mel_bins // pm), pt * pm, 1
        else:
            image_size, channels, patch_size = (self.frames, self.mel_bins), 1, self.patch_size
        return ModelConfig(model=self.model, patch_size=patch_size, image_size=image_size,
                           channels=channels, pred_depth=self.pred_depth, pred_width=self.pred_width,
                           pred_heads=self.pred_heads, dtype=self.dtype, width=self.width, depth=self.depth,
                           heads=self.heads, mlp_ratio=self.mlp_ratio, scan_layers=self.scan_layers,
                           remat=self.remat, mixer=self.mixer, pred_mixer=self.pred_mixer, ssm_state=self.ssm_state,
                           ssm_step=self.ssm_step, scan_order=self.scan_order, ssm_gaps=self.ssm_gaps,
                           norm_eps=self.norm_eps)

    @property
    def mask_config(self) -> RandomConfig:
        from jepa_cli.masks.checks import validate, validate_token_grid

        return validate_token_grid(lambda grid: validate(RandomConfig(grid=grid, ratio=self.ratio)), self,
                                   (self.frames, self.mel_bins), self.patch_shape, "spectrograms",
                                   ("frames", "mel_bins", "patch_size", "patch_frames", "patch_mels"))

    @classmethod
    def from_dict(cls, config: dict) -> "AudioJEPAConfig":
        own = {f.name for f in dataclasses.fields(cls)}
        for k in config:
            if k not in own:
                raise InputError(f"unknown audio-jepa option {k!r}")
        return cls(**{k: _tuplify(v) for k, v in config.items()})

    def to_dict(self) -> dict:
        return {f.name: _listify(getattr(self, f.name)) for f in dataclasses.fields(self)}


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
        from pathlib import Path

        from jepa_cli.data import store

        inputs = store.open_array(Path(path) / "inputs")
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
        b = spec.shape[0]
        m = self.sample_masks(key, b)
        target_encoder = self._encoder.merge(jax.lax.stop_gradient(ema))
        h_full = jax.lax.stop_gradient(target_encoder(spec).astype(jnp.float32))  # [B, N, D]
        h = gather_tokens(h_full, m.target_index)  # [B, 1, T, D]
        encoder = self._encoder.merge(params["encoder"])
        predictor = self._predictor.merge(params["predictor"])
        z_ctx = encoder(spec, m.context_index, m.context_valid)  # [B, 1, K, D]
        z = predictor(z_ctx, m.context_index, m.context_valid, m.target_index, m.target_valid)
        prediction_loss = norm_mse(z, h, m.target_valid)
        pooled = telemetry.masked_mean_pool(z_ctx, m.context_valid).mean(axis=1)  # [B, D]
        value, regularisers = telemetry.with_anticollapse(prediction_loss, pooled, self.config, key)
        aux = {
            "loss": value,
            **regularisers,
            **telemetry.collapse_metrics(pooled, h_full.mean(axis=1)),
            "context_tokens": jnp.mean(jnp.sum(m.context_valid, axis=-1).astype(jnp.float32)),
            "target_tokens": jnp.mean(jnp.sum(m.target_valid, axis=(1, 2)).astype(jnp.float32)),
        }
        return value, aux

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
            from jepa_cli.data.audio import fit_length

            wave = fit_length(to_float(example["audio"]), samples, "center")
            return {**example, "audio": normalise_waveform(wave)}

        return transform

    def train_transform(self, image_size=None, on_device: bool = False):
        """No augmentation (none in the released code): centre crop or pad to the clip length, then
        the waveform normalisation (on the host whatever `on_device` says: waveforms are not pixels)."""
        return self._transform()

    def eval_transform(self, image_size=None):
        return self._transform()
