"""Audio-JEPA's options (objectives/audio_jepa.py): the model, the log-mel front-end, the masks and the
EMA, with the released LudovicTuncay/Audio-JEPA code's values as defaults. Imports neither JAX nor
click, so `jepa train --help` reads them first."""

from __future__ import annotations

import dataclasses

from jepa_cli.data.fbank import FbankConfig
from jepa_cli.errors import InputError
from jepa_cli.fieldtypes import check_field_types
from jepa_cli.masks.checks import validate, validate_token_grid
from jepa_cli.masks.config import RandomConfig
from jepa_cli.models.config import MODEL_SIZES, ModelConfig
from jepa_cli.models.mixer_pattern import SSM_STEP
from jepa_cli.objectives.ijepa_config import IJEPAConfig, check_anticollapse
from jepa_cli.options import option, option_of

SPEC_NORMS = ("none", "dataset", "clip")


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
    sigreg_on: str = option_of(IJEPAConfig, "sigreg_on", "pooled")

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
