"""The options of the generative objectives (`flow`, `diffusion`), declared once.

Each dataclass field is one option (jepa_cli/options.py): its default, and (in `metadata`) its help
and whether it is a `jepa train` flag. The same field is the TOML key in `[flow]` / `[diffusion]` and the key in
run.json's objective_config (to_dict / from_dict), as IJEPAConfig's fields are. This module imports
no JAX, so `jepa train --help` can list the flags.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from jepa_cli.errors import InputError
from jepa_cli.fieldtypes import check_field_types
from jepa_cli.models.config import ModelConfig
from jepa_cli.models.mixer_pattern import SCAN_ORDERS, SSM_STEP, check_ssm, parse_mixer
from jepa_cli.names import COMPUTE_DTYPES as DTYPES
from jepa_cli.options import option, option_of

MODALITIES = ("image", "latent")
SCHEDULES = ("cosine", "edm")
PREDICTIONS = ("eps", "x0", "v")
# EDM's log-normal training distribution of sigma, (P_mean, P_std), as published: EDM (Karras et al. 2022,
# Table 1, pixels); EDM2 (Karras et al. 2024, train_edm2.py presets edm2-img64-*: ImageNet-64 pixels;
# edm2-img512-*: ImageNet-512 in the SD VAE's latent space).
EDM_PRESETS = {"edm": (-1.2, 1.2), "edm2-pixel": (-0.8, 1.6), "edm2-latent": (-0.4, 1.0)}
# The sigma_data every preset was published with: pixels in [-1, 1] (EDM Table 1) and EDM2's latents,
# scaled to std 0.5 (NVlabs/edm2 training/encoders.py, final_std = 0.5). A preset's noise levels are
# relative to the data's std, so at another sigma_data its P_mean moves by ln(sigma_data / 0.5): the
# same distribution of sigma / sigma_data (edm_p_mean).
EDM_SIGMA_DATA = 0.5
# The default preset and sigma_data (the data's std in model space) for each modality: images are
# scaled to [-1, 1], where EDM and EDM2 take sigma_data 0.5; latents are standardised by their
# latent_shift / latent_scale (encode-latents writes the per-channel mean and 1/std), so their std is 1.
DATA_DEFAULTS = {"image": ("edm2-pixel", 0.5), "latent": ("edm2-latent", 1.0)}


def edm_p_mean(preset: str, sigma_data: float) -> float:
    """The preset's P_mean at `sigma_data`: ln sigma - ln sigma_data keeps the published distribution."""
    return EDM_PRESETS[preset][0] + math.log(sigma_data / EDM_SIGMA_DATA)

# `jepa sample`'s ranges, here so that the CLI declares them without importing JAX. Guidance scales in
# use lie in 1..10; far beyond, the amplified difference c - u swamps the prediction and every pixel
# saturates (scale 1e30 gives all-black images), so 100 bounds it with room to spare.
MAX_GUIDANCE_SCALE = 100.0
# DDIM's eta (Song et al. 2021, eq. 16): 0 deterministic, 1 the DDPM posterior's noise; above 1 the
# injected noise would exceed the step's whole noise budget sigma_s.
ETA_RANGE = (0.0, 1.0)
# Sampling steps: samplers in use take 1..1000 (DDPM's 1000 the most); the trajectory's plan is
# built step by step before tracing, so 10^9 steps would exhaust memory before the first sample.
MAX_SAMPLING_STEPS = 10_000


def _opt(default, help: str, flag: bool = True, applies: tuple[str, ...] = ("flow", "diffusion"),
         choices: tuple[str, ...] | None = None):
    """An option of the generative objectives (jepa_cli/options.py): a `jepa train` flag unless `flag`
    is False, read by the objectives in `applies`."""
    return option(default, help, flag=flag, applies=applies, choices=choices)


@dataclasses.dataclass(frozen=True)
class GenerativeConfig:
    # model: the DiT (defaults: tiny, for CPU)
    width: int = _opt(64, "DiT width.", flag=False)
    depth: int = _opt(4, "DiT blocks.", flag=False)
    heads: int = _opt(4, "DiT attention heads.", flag=False)
    mlp_ratio: float = _opt(4.0, "MLP hidden width / width.", flag=False)
    patch_size: int = _opt(2, "Patch size in pixels (images).", flag=False)
    image_size: int | tuple[int, int] = _opt(16, "Image size (default: the dataset's).", flag=False)
    channels: int = _opt(1, "Image channels (default: the dataset's).", flag=False)
    dtype: str = _opt("float32", "Compute dtype: float32 | bfloat16.", flag=False)
    latent_tokens: int | None = _opt(None, "Tokens a [D] latent is cut into (default: the largest of 8, 4, 2, 1 "
                                           "dividing D).")
    # the DiT's token mixers: the encoders' options (models/config.py), the same flags
    mixer: str = option_of(ModelConfig, "mixer", "attn")
    ssm_state: int = option_of(ModelConfig, "ssm_state", 64)
    ssm_step: tuple[float, float] = option_of(ModelConfig, "ssm_step", SSM_STEP)
    scan_order: str = option_of(ModelConfig, "scan_order", "raster")
    # the data (filled from the dataset by dataset_options)
    modality: str = _opt("image", "image | latent (default: the dataset's).", flag=False)
    latent_shape: tuple[int, ...] | None = _opt(None, "[D] or [T, D] (from the dataset).", flag=False)
    latent_shift: tuple[float, ...] | None = _opt(None, "Per-channel shift (the dataset's latent_shift).", flag=False)
    latent_scale: tuple[float, ...] | None = _opt(None, "Per-channel scale (the dataset's latent_scale).", flag=False)
    num_classes: int = _opt(0, "Classes (0: unconditional; default: the dataset's).", flag=False)
    # training
    cond_drop: float = _opt(0.1, "Probability of dropping the label to the null class (classifier-free guidance).")
    ema_decay: float = _opt(0.9999, "Constant EMA decay of the whole parameter tree.")
    ema_power: float | None = _opt(None, "EDM2 power-function EMA profile gamma: decay (1 - 1/t)^(gamma + 1) "
                                         "at update t (wins over --ema-decay).")
    # flow matching
    logit_mean: float = _opt(0.0, "Logit-normal t: mean (SD3).", applies=("flow",))
    logit_std: float = _opt(1.0, "Logit-normal t: std (SD3).", applies=("flow",))
    flow_shift: float = _opt(1.0, "Resolution shift s: t' = s t / (1 + (s - 1) t) (SD3).", applies=("flow",))
    # diffusion
    schedule: str = _opt("cosine", "cosine (continuous VP) | edm (Karras et al. 2022).", applies=("diffusion",),
                         choices=SCHEDULES)
    prediction: str | None = _opt(None, "eps | x0 | v for the cosine schedule (default v); edm predicts its "
                                        "preconditioned F.", applies=("diffusion",), choices=PREDICTIONS)
    min_snr_gamma: float | None = _opt(None, "Min-SNR-gamma weighting of the x0 loss (Hang et al. 2023), "
                                             "converted into the prediction's space.", applies=("diffusion",))
    edm_preset: str | None = _opt(None, "EDM's log-normal sigma (P_mean, P_std) as published at sigma_data 0.5: edm "
                                        "(-1.2, 1.2) | edm2-pixel (-0.8, 1.6) | edm2-latent (-0.4, 1.0), P_mean "
                                        "shifted by ln(sigma_data / 0.5) (default: edm2-latent for latents, "
                                        "edm2-pixel for images).", applies=("diffusion",),
                                  choices=tuple(EDM_PRESETS))
    p_mean: float | None = _opt(None, "EDM log-normal sigma: mean (default: the --edm-preset's).",
                                applies=("diffusion",))
    p_std: float | None = _opt(None, "EDM log-normal sigma: std (default: the --edm-preset's).",
                               applies=("diffusion",))
    sigma_data: float | None = _opt(None, "EDM sigma_data, the data's std in model space (default: 1.0 for latents, "
                                          "standardised by latent_shift/latent_scale; 0.5 for images in [-1, 1]).",
                                    applies=("diffusion",))
    edm_logvar: bool = _opt(False, "EDM2's learned uncertainty: a linear head on Fourier features of the noise "
                                   "level gives log-variance u(sigma); loss = weight |D - x0|^2 / exp(u) + u.",
                            applies=("diffusion",))

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, list):
                object.__setattr__(self, f.name, tuple(v))
        check_field_types(self, self.owner)
        if self.modality not in MODALITIES:
            raise InputError(f"{self.owner} option modality must be one of {', '.join(MODALITIES)}, got {self.modality!r}")
        if self.dtype not in DTYPES:
            raise InputError(f"unknown dtype {self.dtype!r} (choose from {', '.join(DTYPES)})")
        if min(self.width, self.depth, self.heads, self.patch_size, self.channels) <= 0 or self.num_classes < 0:
            raise InputError(f"{self.owner}: width, depth, heads, patch_size, channels must be positive")
        if self.width % self.heads or self.width % 4:
            raise InputError(f"width {self.width} must be divisible by 4 and by {self.heads} heads")
        _ = self.mixers  # parses the pattern: a bad one is an InputError
        object.__setattr__(self, "ssm_step", tuple(self.ssm_step))
        check_ssm(self.ssm_state, self.ssm_step)
        if self.scan_order not in SCAN_ORDERS:
            raise InputError(f"unknown scan_order {self.scan_order!r} (choose from {', '.join(SCAN_ORDERS)})")
        if self.scan_order != "raster" and self.modality != "image":
            raise InputError(f"scan_order {self.scan_order} applies to image grids; latent tokens are scanned "
                             "in their order (raster)")
        if not 0.0 <= self.cond_drop <= 1.0:
            raise InputError(f"cond_drop must be in [0, 1], got {self.cond_drop}")
        if not 0.0 <= self.ema_decay <= 1.0:
            raise InputError(f"ema_decay must be in [0, 1], got {self.ema_decay}")
        if self.ema_power is not None and self.ema_power <= -1:
            raise InputError(f"ema_power must be > -1, got {self.ema_power}")
        if self.logit_std <= 0 or self.flow_shift <= 0:
            raise InputError("logit_std and flow_shift must be > 0")
        if self.schedule not in SCHEDULES:
            raise InputError(f"unknown schedule {self.schedule!r} (choose from {', '.join(SCHEDULES)})")
        if self.prediction is not None:
            if self.prediction not in PREDICTIONS:
                raise InputError(f"unknown prediction {self.prediction!r} (choose from {', '.join(PREDICTIONS)})")
            if self.schedule == "edm":
                raise InputError("prediction applies to the cosine schedule; edm predicts its preconditioned F")
        if self.min_snr_gamma is not None and self.min_snr_gamma <= 0:
            raise InputError(f"min_snr_gamma must be > 0, got {self.min_snr_gamma}")
        if self.edm_preset is not None and self.edm_preset not in EDM_PRESETS:
            raise InputError(f"unknown edm_preset {self.edm_preset!r} (choose from {', '.join(EDM_PRESETS)})")
        self._resolve_data_defaults()
        if self.p_std <= 0 or self.sigma_data <= 0:
            raise InputError("p_std and sigma_data must be > 0")
        if self.edm_logvar and self.schedule != "edm":
            raise InputError("edm_logvar applies to the edm schedule (--schedule edm)")
        if self.modality == "image":
            h, w = (self.image_size, self.image_size) if isinstance(self.image_size, int) else self.image_size
            if h % self.patch_size or w % self.patch_size:
                raise InputError(f"image size {h}x{w} is not divisible by the patch size {self.patch_size}")
        else:
            if self.latent_shape is None or len(self.latent_shape) not in (1, 2):
                raise InputError(f"{self.owner}: a latent model needs latent_shape [D] or [T, D] (from the dataset)")
            d = self.latent_shape[-1]
            for name in ("latent_shift", "latent_scale"):
                v = getattr(self, name)
                if v is not None and len(v) != d:
                    raise InputError(f"{name} needs {d} values, got {len(v)}")
            if self.latent_tokens is not None and (self.latent_tokens <= 0 or d % self.latent_tokens):
                raise InputError(f"latent_tokens must divide the latent width {d}, got {self.latent_tokens}")

    def _resolve_data_defaults(self) -> None:
        """p_mean, p_std and sigma_data left unset take the modality's defaults (DATA_DEFAULTS) or the
        named preset's, so that run.json records the values the run trains with. edm_preset is
        recorded when both p_mean and p_std came from a preset: it says where they came from. A preset's
        p_mean is taken at the run's sigma_data (edm_p_mean)."""
        preset, sigma_data = DATA_DEFAULTS[self.modality]
        preset = self.edm_preset or preset
        if self.p_mean is None and self.p_std is None:
            object.__setattr__(self, "edm_preset", preset)
        if self.sigma_data is None:
            object.__setattr__(self, "sigma_data", sigma_data)
        if self.sigma_data <= 0:
            raise InputError("p_std and sigma_data must be > 0")
        for name, value in (("p_mean", edm_p_mean(preset, self.sigma_data)), ("p_std", EDM_PRESETS[preset][1])):
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)

    owner = "generative"

    @property
    def mixers(self) -> tuple[str, ...]:
        """The mixer of each DiT block ('attn' or 's5'): the pattern repeated to the depth."""
        return parse_mixer(self.mixer, self.depth, "DiT")

    @classmethod
    def from_dict(cls, config: dict) -> "GenerativeConfig":
        own = {f.name: f for f in dataclasses.fields(cls)}
        for k in config:
            if k not in own or cls.owner not in own[k].metadata["applies"]:
                raise InputError(f"unknown {cls.owner} option {k!r}")
        return cls(**config)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
                for f in dataclasses.fields(self) if self.owner in f.metadata["applies"]}


def config_notes(objective: str, table: dict[str, Any]) -> dict[str, str]:
    """Notes for `jepa train --print-config` beside keys of the objective's resolved `table` whose value
    came from the data: {key: note}. Diffusion's sigma_data, when it is the modality's default."""
    if objective != "diffusion" or table.get("schedule") != "edm":
        return {}
    modality = table.get("modality", "image")
    if modality not in DATA_DEFAULTS or table.get("sigma_data") != DATA_DEFAULTS[modality][1]:
        return {"sigma_data": "given (the recipe, the environment or --sigma-data)"}
    where = ("latents standardised by the dataset's latent_shift/latent_scale have std 1" if modality == "latent"
             else "images scaled to [-1, 1], EDM's value")
    return {"sigma_data": f"from the data: {where}"}


@dataclasses.dataclass(frozen=True)
class FlowConfig(GenerativeConfig):
    owner = "flow"


@dataclasses.dataclass(frozen=True)
class DiffusionConfig(GenerativeConfig):
    owner = "diffusion"
