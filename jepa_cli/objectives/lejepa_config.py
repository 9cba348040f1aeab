"""LeJEPA's options (LeJEPAConfig): the encoder's (ModelConfig's and VideoModelConfig's fields, reused),
the audio clips' (AudioJEPAConfig's sample_rate and seconds), the views', the projector's and SIGReg's (IJEPAConfig's sigreg_* fields, reused), declared once
(jepa_cli/options.py). No JAX here, so `jepa train` reads the flags before JAX loads.

Defaults are rbalestr-lab/lejepa's: README.md "GOTO hyperparameters" (views, crops, colour
augmentations), MINIMAL.md (projector, slices), scripts/launch_*_ablation.md (lambda 0.05).

The views are cut from what the dataset holds (`modality`, the dataset's): images as the reference
does; audio clips as their log-mel spectrogram (`data/log_mel.py`'s Kaldi front-end, 25 ms frames every
10 ms, 128 mel bins), read as a one-channel image of frames x mel bins whose views are random resized
crops along time and frequency (BYOL-A's Random Resize Crop, Niizumi et al. 2022); video clips as
spatio-temporal crops: a random window of frames, every frame cut by one random resized crop.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jepa_cli.errors import InputError
from jepa_cli.fieldtypes import check_field_types
from jepa_cli.models.config import MODEL_SIZES, ModelConfig, VideoModelConfig, as_pair
from jepa_cli.models.mixer_pattern import SSM_STEP
from jepa_cli.objectives.audio_jepa_config import AudioJEPAConfig
from jepa_cli.objectives.ijepa_config import IJEPAConfig, check_sigreg
from jepa_cli.options import option, option_of

LEJEPA = ("lejepa",)
# README.md: 98 px local views beside 224 px global ones; the default local size keeps that ratio (along
# every axis: a video's local frames, an audio clip's log-mel frames and mel bins)
LOCAL_FRACTION = 98 / 224
MODALITIES = ("image", "audio", "video")


def _tuplify(v):
    return tuple(_tuplify(x) for x in v) if isinstance(v, list) else v


def _listify(v):
    return [_listify(x) for x in v] if isinstance(v, tuple) else v


def _ints(text: str, name: str) -> tuple[int, ...]:
    """'256,256,64' (the command line's form of a list option) -> (256, 256, 64)."""
    try:
        return tuple(int(p) for p in text.replace(" ", "").split(","))
    except ValueError:
        raise InputError(f"lejepa option {name} must be integers separated by commas, got {text!r}") from None


@dataclasses.dataclass(frozen=True)
class LeJEPAConfig:
    """One encoder (no predictor, no EMA), its projector, the views and the loss's lambda."""

    # the encoder: ModelConfig's options (the predictor's are not LeJEPA's and are refused)
    model: str = option_of(ModelConfig, "model", "tiny")
    patch_size: int = option_of(ModelConfig, "patch_size", 16)
    image_size: int | tuple[int, int] = option_of(ModelConfig, "image_size", 224)  # README.md: global views 224
    channels: int = option_of(ModelConfig, "channels", 3)
    dtype: str = option_of(ModelConfig, "dtype", "float32")
    width: int | None = option_of(ModelConfig, "width", None)
    depth: int | None = option_of(ModelConfig, "depth", None)
    heads: int | None = option_of(ModelConfig, "heads", None)
    mlp_ratio: float | None = option_of(ModelConfig, "mlp_ratio", None)
    scan_layers: bool = option_of(ModelConfig, "scan_layers", False)
    remat: str = option_of(ModelConfig, "remat", "none")
    attention_impl: str = option_of(ModelConfig, "attention_impl", "xla")
    mixer: str = option_of(ModelConfig, "mixer", "attn")
    ssm_state: int = option_of(ModelConfig, "ssm_state", 64)
    ssm_step: tuple[float, float] = option_of(ModelConfig, "ssm_step", SSM_STEP)
    scan_order: str = option_of(ModelConfig, "scan_order", "raster")
    norm_eps: float = option_of(ModelConfig, "norm_eps", 1e-6)
    # what the views are cut from: the dataset's modality, and the geometry of its clips
    modality: str = option("image", "What the views are cut from: image | audio (its log-mel) | video (default in "
                                    "jepa train: the dataset's).", applies=LEJEPA, choices=MODALITIES)
    num_frames: int = option_of(VideoModelConfig, "num_frames", 16)
    tubelet_size: int = option_of(VideoModelConfig, "tubelet_size", 2)
    global_frames: int | None = option(None, "Video: frames of each global view, a random window of the clip, whole "
                                             "tubelets (default: num_frames, the whole clip).", flag=True,
                                       applies=LEJEPA)
    local_frames: int | None = option(None, "Video: frames of each local view, a random window of the clip, whole "
                                            "tubelets (default: 98/224 of global_frames, rounded to whole "
                                            "tubelets).", flag=True, applies=LEJEPA)
    sample_rate: int = option_of(AudioJEPAConfig, "sample_rate", 16000)
    seconds: float = option_of(AudioJEPAConfig, "seconds", 1.0)
    # views (README.md "Data augmentation and views": 2 global + 6 local, RandomResizedCrop scales)
    views_global: int = option(2, "Global views of each example, at image_size.", flag=True, applies=LEJEPA)
    views_local: int = option(6, "Local views of each example, at local_size.", flag=True, applies=LEJEPA)
    local_size: int | tuple[int, int] | None = option(None, "Local view size, S or HxW; for audio FRAMESxMEL_BINS of "
                                                            "the log-mel (default: 98/224 of the global views' "
                                                            "size as the reference's 98 px beside 224, rounded to "
                                                            "whole patches).", flag=True, applies=LEJEPA)
    crop_scale: tuple[float, float] = option_of(IJEPAConfig, "crop_scale", (0.3, 1.0))
    local_scale: tuple[float, float] = option((0.05, 0.3), "Local views' random resized crop: area scale LO,HI.",
                                              flag=True, applies=LEJEPA, metavar="LO,HI")
    crop_ratio: tuple[float, float] = option_of(IJEPAConfig, "crop_ratio", (3 / 4, 4 / 3))
    # the colour and geometric augmentations every view gets (README.md); the reference's Gaussian blur
    # (p 0.5), solarisation (p 0.2) and hue jitter (0.1) are not taken
    hflip: bool = option(True, "Flip each view horizontally with probability 0.5.", applies=LEJEPA)
    jitter_prob: float = option(0.8, "Probability of a colour jitter per view.", applies=LEJEPA)
    jitter: tuple[float, float, float] = option((0.4, 0.4, 0.2), "Colour jitter strengths BRIGHTNESS,CONTRAST,"
                                                "SATURATION (torchvision ColorJitter's).", applies=LEJEPA)
    grayscale_prob: float = option(0.2, "Probability of turning a 3-channel view grey.", applies=LEJEPA)
    mean: tuple[float, ...] | None = option_of(IJEPAConfig, "mean", None)
    std: tuple[float, ...] | None = option_of(IJEPAConfig, "std", None)
    # MINIMAL.md test transform: Resize(128) + CenterCrop(128), the whole image
    eval_resize_ratio: float = option_of(IJEPAConfig, "eval_resize_ratio", 1.0)
    # projector (MINIMAL.md ViTEncoder: torchvision MLP(512, [2048, 2048, proj_dim=128], BatchNorm1d))
    proj_dims: tuple[int, ...] = option((2048, 2048, 128), "Projector MLP layer widths, the last the "
                                        "projection's (Linear, BatchNorm, ReLU between layers).", flag=True,
                                        applies=LEJEPA, metavar="W1,W2,...")
    # the loss: (1 - sigreg_weight) x invariance + sigreg_weight x SIGReg
    sigreg_weight: float = option_of(IJEPAConfig, "sigreg_weight", 0.05)  # scripts/launch_*_ablation.md
    sigreg_slices: int = option_of(IJEPAConfig, "sigreg_slices", 256)  # MINIMAL.md SIGReg
    sigreg_knots: int = option_of(IJEPAConfig, "sigreg_knots", 17)  # MINIMAL.md SIGReg
    sigreg_t_max: float = option_of(IJEPAConfig, "sigreg_t_max", 3.0)  # MINIMAL.md SIGReg

    def __post_init__(self):
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _tuplify(getattr(self, f.name)))
        if isinstance(self.proj_dims, str):
            object.__setattr__(self, "proj_dims", _ints(self.proj_dims, "proj_dims"))
        check_field_types(self, "lejepa")
        check_sigreg(self)
        if self.views_global < 1 or self.views_local < 0:
            raise InputError(f"lejepa needs views_global >= 1 and views_local >= 0, got {self.views_global} "
                             f"and {self.views_local}")
        if self.views_global + self.views_local < 2:
            raise InputError(f"lejepa needs at least 2 views of each example (views_global + views_local), got "
                             f"{self.views_global + self.views_local}")
        for name in ("crop_scale", "local_scale"):
            lo, hi = getattr(self, name)
            if not 0.0 < lo <= hi <= 1.0:
                raise InputError(f"{name} must be 0 < LO <= HI <= 1, got {list(getattr(self, name))}")
        lo, hi = self.crop_ratio
        if not 0.0 < lo <= hi:
            raise InputError(f"crop_ratio must be 0 < LO <= HI, got {list(self.crop_ratio)}")
        for name in ("jitter_prob", "grayscale_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise InputError(f"{name} must be in [0, 1], got {getattr(self, name)!r}")
        if min(self.jitter) < 0.0:
            raise InputError(f"jitter strengths must be >= 0, got {list(self.jitter)}")
        if not self.proj_dims or min(self.proj_dims) < 1:
            raise InputError(f"proj_dims must be one or more widths >= 1, got {list(self.proj_dims)}")
        if not self.eval_resize_ratio >= 1.0:
            raise InputError(f"eval_resize_ratio must be >= 1 (1: no border cropped), got {self.eval_resize_ratio!r}")
        for name in ("mean", "std"):
            v = getattr(self, name)
            if v is not None and len(v) not in (1, self.channels):
                raise InputError(f"{name} needs 1 or {self.channels} values, got {len(v)}")
        if self.modality not in MODALITIES:
            raise InputError(f"lejepa option modality must be one of {', '.join(MODALITIES)}, got {self.modality!r}")
        if self.sample_rate <= 0 or self.seconds <= 0:
            raise InputError(f"sample_rate and seconds must be positive, got {self.sample_rate} and {self.seconds}")
        if self.modality == "video":
            self._check_frames()
        if self.modality == "audio":
            frames, mels = self.log_mel_shape
            if frames < self.patch_size or mels < self.patch_size:
                raise InputError(f"a {self.seconds:g} s clip at {self.sample_rate} Hz gives a {frames}x{mels} log-mel "
                                 f"(frames x mel bins), smaller than one {self.patch_size}x{self.patch_size} patch")
        model = self.model_config  # validates the encoder's fields
        if self.local_size is not None:
            h, w = as_pair(self.local_size)
            gh, gw = self.global_size
            if h <= 0 or w <= 0 or h % self.patch_size or w % self.patch_size:
                raise InputError(f"local_size {h}x{w} must be positive whole patches of {self.patch_size}")
            if h > gh or w > gw:
                what = "the log-mel's (frames x mel bins)" if self.modality == "audio" else "image_size"
                raise InputError(f"local_size {h}x{w} is larger than the input, {what} {gh}x{gw}")
        _ = model, self.global_model_config, self.local_model_config  # every grid (a mixer pattern is checked at each)

    def _check_frames(self) -> None:
        """Video: the views' windows are whole tubelets within the clip (num_frames)."""
        t, n = self.tubelet_size, self.num_frames
        for name in ("global_frames", "local_frames"):
            v = getattr(self, name)
            if v is None:
                continue
            if v <= 0 or (t > 0 and v % t):
                raise InputError(f"{name} {v} must be positive whole tubelets of {t} frames")
            if v > n:
                raise InputError(f"{name} {v} is larger than the input, num_frames {n}")

    def check_views_fit(self) -> None:
        """InputError when a video's view lengths are given for another modality's views. Checked when the
        views are made (the objective's train_transform), since the trainer fills `modality` from the
        dataset after the options it implies."""
        given = [name for name in ("global_frames", "local_frames") if getattr(self, name) is not None]
        if given and self.modality != "video":
            verb = "apply" if len(given) > 1 else "applies"
            raise InputError(f"{' and '.join(given)} {verb} to video clips; the dataset holds {self.modality}")

    @property
    def clip_samples(self) -> int:
        """Audio: samples of one clip, seconds x sample_rate."""
        return int(round(self.seconds * self.sample_rate))

    @property
    def fbank_config(self):
        """Audio: the log-mel front-end (data/log_mel.py raw_fbank_config: Kaldi fbank, 25 ms frames every
        10 ms, 128 mel bins), the one `jepa probe --raw` reads audio with."""
        from jepa_cli.data.log_mel import raw_fbank_config

        return raw_fbank_config(self.sample_rate)

    @property
    def log_mel_shape(self) -> tuple[int, int]:
        """Audio: (frames, mel bins) of one clip's log-mel."""
        config = self.fbank_config
        return config.frames(self.clip_samples), config.num_bins

    @property
    def global_size(self) -> tuple[int, int]:
        """(h, w) of what the global views are resized to and the encoder reads at evaluation:
        image_size (images, video frames), or for audio the log-mel (frames, mel bins) cut to whole
        patches."""
        if self.modality == "audio":
            p = self.patch_size
            return tuple(s // p * p for s in self.log_mel_shape)
        return as_pair(self.image_size)

    @property
    def model_config(self) -> ModelConfig:
        """The encoder as evaluation reads one example (the whole image, clip or log-mel); the
        predictor is absent (depth 0)."""
        names = {f.name for f in dataclasses.fields(VideoModelConfig if self.modality == "video" else ModelConfig)}
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name in names}
        width = self.width or MODEL_SIZES.get(self.model, MODEL_SIZES["tiny"]).width  # the predictor's, unused
        if self.modality == "video":
            return VideoModelConfig(**own, pred_depth=0, pred_width=width)
        if self.modality == "audio":  # a one-channel image of frames x mel bins
            own.update(image_size=self.global_size, channels=1)
        return ModelConfig(**own, pred_depth=0, pred_width=width)

    @property
    def global_frames_count(self) -> int:
        """Video: frames of each global view (global_frames, or the whole clip)."""
        return self.global_frames or self.num_frames

    @property
    def local_frames_count(self) -> int:
        """Video: frames of each local view (local_frames, or LOCAL_FRACTION of the global views' in
        whole tubelets)."""
        t = self.tubelet_size
        return self.local_frames or max(t, round(self.global_frames_count * LOCAL_FRACTION / t) * t)

    @property
    def global_model_config(self) -> ModelConfig:
        """The encoder at the global views' size: the evaluation's, with a video's global_frames."""
        if self.modality == "video":
            return dataclasses.replace(self.model_config, num_frames=self.global_frames_count)
        return self.model_config

    @property
    def local_size_pixels(self) -> tuple[int, int]:
        """(h, w) of the local views: local_size, or LOCAL_FRACTION of global_size in whole patches."""
        if self.local_size is not None:
            return as_pair(self.local_size)
        p = self.patch_size
        return tuple(max(p, round(s * LOCAL_FRACTION / p) * p) for s in self.global_size)

    @property
    def local_model_config(self) -> ModelConfig:
        """The same encoder read at the local views' size (the same parameters: the position table is
        the fixed sin-cos of each call's grid)."""
        local = dataclasses.replace(self.model_config, image_size=self.local_size_pixels)
        if self.modality == "video":
            return dataclasses.replace(local, num_frames=self.local_frames_count)
        return local

    norm_mean = IJEPAConfig.norm_mean  # the given mean and std, or the channels' defaults
    norm_std = IJEPAConfig.norm_std

    @classmethod
    def from_dict(cls, config: dict) -> "LeJEPAConfig":
        """Flat options; an unknown key (a predictor's, the masks', the EMA's) is an InputError naming it."""
        own = {f.name for f in dataclasses.fields(cls)}
        for k in config:
            if k not in own:
                raise InputError(f"unknown lejepa option {k!r}")
        return cls(**{k: _tuplify(v) for k, v in config.items()})

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _listify(getattr(self, f.name)) for f in dataclasses.fields(self)}
