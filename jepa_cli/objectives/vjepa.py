"""V-JEPA (Bardes et al. 2024), as the official facebookresearch/jepa app/vjepa/train.py.

A clip is cut into tubelets (2 frames x 16 x 16 pixels) with a fixed 3D sin-cos position embedding.
Each mask type (multiblock3d: 8 small blocks and 2 large ones, through every frame) gives its own
context and target set: the context encoder sees the context tokens of its mask type, the predictor
(one zero-initialised mask token per mask type) predicts the target encoder's layer-normalised
features at that type's targets, and the loss mean(|z - h|^p) / p (p = 1) is averaged over the
mask types. The target encoder is the EMA of the context encoder, runs on the whole clip and is
never differentiated. Image datasets are refused (modalities): a clip is what it trains on.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np

from jepa_cli.data import transforms
from jepa_cli.errors import InputError
from jepa_cli.models import ModuleTemplate
from jepa_cli.models.config import VideoModelConfig
from jepa_cli.objectives.base import EncoderPredictorObjective
from jepa_cli.objectives.ijepa import IJEPAObjective, layer_norm_no_affine
from jepa_cli.objectives.ijepa_config import EncoderPredictorOptions, IJEPAConfig, check_anticollapse
from jepa_cli.options import option, option_of

@dataclasses.dataclass(frozen=True)
class VJEPAConfig(VideoModelConfig, EncoderPredictorOptions):
    """The video model's fields (flat, as TOML keys), the mask options and the objective's own."""

    pred_depth: int = option_of(VideoModelConfig, "pred_depth", 12)  # vitl16.yaml model.pred_depth
    pred_width: int = option_of(VideoModelConfig, "pred_width", 384)  # vitl16.yaml model.pred_embed_dim
    # masks: overrides of jepa_cli.masks.MultiBlock3DConfig fields (its defaults are vitl16.yaml's)
    mask_options: tuple[tuple[str, Any], ...] = ()
    # objective
    loss_exp: float = option(1.0, "Loss exponent p of mean(|z - h|^p) / p (1: L1).")  # vitl16.yaml loss.loss_exp
    ema: tuple[float, float] = option_of(IJEPAConfig, "ema", (0.998, 1.0))  # vitl16.yaml optimization.ema
    total_updates: float | None = option_of(IJEPAConfig, "total_updates", None)
    mean: tuple[float, ...] | None = option_of(IJEPAConfig, "mean", None)
    std: tuple[float, ...] | None = option_of(IJEPAConfig, "std", None)
    # vitl16.yaml data_aug.random_resize_scale, random_resize_aspect_ratio
    crop_scale: tuple[float, float] = option_of(IJEPAConfig, "crop_scale", (0.3, 1.0))
    crop_ratio: tuple[float, float] = option_of(IJEPAConfig, "crop_ratio", (0.75, 1.35))
    # app/vjepa/transforms.py: random_horizontal_flip (True in make_transforms)
    hflip: bool = option(True, "Random horizontal flip of each clip.")
    var_weight: float = option_of(IJEPAConfig, "var_weight", 0.0)
    var_target: float = option_of(IJEPAConfig, "var_target", 1.0)
    cov_weight: float = option_of(IJEPAConfig, "cov_weight", 0.0)
    sigreg_weight: float = option_of(IJEPAConfig, "sigreg_weight", 0.0)
    sigreg_slices: int = option_of(IJEPAConfig, "sigreg_slices", 256)
    sigreg_knots: int = option_of(IJEPAConfig, "sigreg_knots", 17)
    sigreg_t_max: float = option_of(IJEPAConfig, "sigreg_t_max", 3.0)
    sigreg_on: str = option_of(IJEPAConfig, "sigreg_on", "pooled")

    def __post_init__(self):
        self._normalise_and_check()
        check_anticollapse(self)
        if not self.loss_exp > 0:
            raise InputError(f"loss_exp must be > 0, got {self.loss_exp}")
        super().__post_init__()  # the model fields, tubelet against frames
        self.mask_config  # noqa: B018 - validates the mask options against the token grid

    @property
    def model_config(self) -> VideoModelConfig:
        return VideoModelConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(VideoModelConfig)})

    @property
    def mask_config(self):
        from jepa_cli.masks import config_from_options, validate_token_grid

        frames, rows, cols = self.grid3d
        t, p = self.tubelet_size, self.patch_size
        return validate_token_grid(
            lambda grid: config_from_options("multiblock3d", grid=grid[1:], frames=grid[0], **dict(self.mask_options)),
            self, (frames * t, rows * p, cols * p), (t, p, p), "clips",
            ("num_frames", "tubelet_size", "image_size", "patch_size"))

    owner: ClassVar[str] = "vjepa"
    mask_strategy: ClassVar[str] = "multiblock3d"
    mask_fields_from_model: ClassVar[frozenset[str]] = frozenset({"grid", "frames"})  # the token grid


def l1_pair_loss(pred, target, valid, p: float = 1.0):
    """mean(|z - h|^p) / p over the valid tokens of each mask type, averaged over the types (the
    official loss_fn: one mean per mask-enc/mask-pred pair, summed, divided by their number).
    pred, target [B, M, T, D]; valid [B, M, T]."""
    per_token = jnp.mean(jnp.abs(pred - target) ** p, axis=-1) / p  # [B, M, T]
    w = valid.astype(jnp.float32)
    per_type = jnp.sum(per_token * w, axis=(0, 2)) / jnp.maximum(jnp.sum(w, axis=(0, 2)), 1.0)  # [M]
    return jnp.mean(per_type)


class VJEPAObjective(EncoderPredictorObjective):
    name = "vjepa"
    modalities = ("video",)

    def __init__(self, config: VJEPAConfig | None = None):
        self.config = config or VJEPAConfig()
        self.model_config = self.config.model_config

    @functools.cached_property
    def _predictor(self) -> ModuleTemplate:
        mc, pairs = self.model_config, self.config.mask_config.pairs
        return ModuleTemplate(lambda rngs: mc.predictor(rngs, num_mask_tokens=pairs), key=("vjepa-predictor", mc, pairs))

    @classmethod
    def from_config(cls, config: dict) -> "VJEPAObjective":
        return cls(VJEPAConfig.from_dict(config))

    @classmethod
    def dataset_options(cls, ds: dict) -> dict:
        """Clips [T, H, W, C]: the frames, frame size and channels the dataset holds."""
        if ds.get("modality") != "video":
            return {}
        t, h, w, c = ds["shape"]
        return {"num_frames": t, "channels": c, "image_size": h if h == w else [h, w]}

    # -- parameters ------------------------------------------------------------------------
    # the EMA ramp of I-JEPA: linear from ema[0] to ema[1] (app/vjepa/train.py, momentum_scheduler)
    ema_spec = IJEPAObjective.ema_spec

    # -- training --------------------------------------------------------------------------
    def loss(self, params, ema, batch, key, step):
        clips = batch["video"]
        exponent = self.config.loss_exp
        # C == M: context c predicts target set c; target tokens counted per set
        return self.masked_prediction(
            params, ema, clips, self.sample_masks(key, clips.shape[0]), key,
            lambda z, h, valid: l1_pair_loss(z.astype(jnp.float32), h, valid, exponent),
            target_norm=layer_norm_no_affine, target_token_axes=(-1,))

    # -- evaluation ------------------------------------------------------------------------
    def encode(self, encoder_params, clips, last_layers: int = 1):
        enc = self._encoder.merge(encoder_params)
        return enc(clips, last_layers=last_layers).astype(jnp.float32)

    def _check_clip(self, clip) -> None:
        c = self.config
        shape = np.shape(clip)
        if len(shape) != 4 or shape[0] != c.num_frames or shape[3] != c.channels:
            raise InputError(f"clips are {list(shape)} [T, H, W, C], the model takes {c.num_frames} frames of "
                             f"{c.channels} channel(s) (num_frames, channels)")

    def train_transform(self, image_size=None, on_device: bool = False):
        c = self.config
        crop = transforms.clip_random_resized_crop(image_size or c.image_size, c.norm_mean, c.norm_std,
                                                   c.crop_scale, c.crop_ratio, c.hflip, on_device)

        def transform(example: dict, rng: np.random.Generator) -> dict:
            self._check_clip(example["video"])
            return crop(example, rng)

        if on_device:
            transform.device = crop.device
        return transform

    def eval_transform(self, image_size=None):
        c = self.config
        resize = transforms.clip_resize_center_crop(image_size or c.image_size, c.norm_mean, c.norm_std)

        def transform(example: dict, rng: np.random.Generator | None = None) -> dict:
            self._check_clip(example["video"])
            return resize(example, rng)

        return transform
