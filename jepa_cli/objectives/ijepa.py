"""I-JEPA (Assran et al. 2023), as the official facebookresearch/ijepa src/train.py.

The context encoder sees the context tokens of the image, the predictor predicts the target
encoder's layer-normalised features at the target blocks; the target encoder is the EMA of the
context encoder, runs on the full image and is never differentiated.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jepa_cli.data import transforms
from jepa_cli.errors import InputError
from jepa_cli.objectives.base import EMASpec, EncoderPredictorObjective
from jepa_cli.objectives.ijepa_config import IJEPAConfig


def layer_norm_no_affine(x, eps: float = 1e-5):
    """torch.nn.functional.layer_norm(x, (D,)) as in the official train.py (eps 1e-5)."""
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps)


def elementwise_loss(pred, target, kind: str):
    d = pred - target
    if kind == "smooth_l1":  # beta 1
        a = jnp.abs(d)
        return jnp.where(a < 1.0, 0.5 * d * d, a - 0.5)
    if kind == "l2":
        return d * d
    if kind == "l1":
        return jnp.abs(d)
    raise InputError(f"unknown loss {kind!r}")


def masked_token_loss(pred, target, valid, kind: str = "smooth_l1"):
    """Mean of the elementwise loss over valid tokens and all features.
    pred, target [..., T, D]; valid [..., T]."""
    per_token = jnp.mean(elementwise_loss(pred, target, kind), axis=-1)
    w = valid.astype(jnp.float32)
    return jnp.sum(per_token * w) / jnp.maximum(jnp.sum(w), 1.0)


def ema_momentum(step, ema0: float, ema1: float, total: float | None):
    """m = ema0 + step * (ema1 - ema0) / total, clipped at ema1 (constant ema0 if total is 0)."""
    step = jnp.asarray(step, jnp.float32)
    if not total:
        return jnp.asarray(ema0, jnp.float32) + 0.0 * step
    m = ema0 + step * ((ema1 - ema0) / float(total))
    return jnp.minimum(m, ema1) if ema1 >= ema0 else jnp.maximum(m, ema1)


class IJEPAObjective(EncoderPredictorObjective):
    name = "ijepa"

    def __init__(self, config: IJEPAConfig | None = None):
        self.config = config or IJEPAConfig()
        self.model_config = self.config.model_config

    @classmethod
    def from_config(cls, config: dict) -> "IJEPAObjective":
        return cls(IJEPAConfig.from_dict(config))

    # -- parameters ------------------------------------------------------------------------
    @property
    def ema_spec(self) -> EMASpec:
        ema0, ema1 = self.config.ema
        total = self.config.total_updates
        return EMASpec(source="encoder", momentum=lambda step: ema_momentum(step, ema0, ema1, total))

    # -- training --------------------------------------------------------------------------
    def loss(self, params, ema, batch, key, step):
        images = batch["image"]
        kind = self.config.loss
        # targets: the EMA encoder's layer-normalised tokens (official src/train.py, forward_target)
        return self.masked_prediction(
            params, ema, images, self.sample_masks(key, images.shape[0]), key,
            lambda z, h, valid: masked_token_loss(z.astype(jnp.float32), h, valid, kind),
            target_norm=layer_norm_no_affine)

    # -- evaluation ------------------------------------------------------------------------
    def encode(self, encoder_params, images, last_layers: int = 1):
        enc = self._encoder.merge(encoder_params)
        return enc(images, last_layers=last_layers).astype(jnp.float32)

    def train_transform(self, image_size=None, on_device: bool = False):
        c = self.config
        return transforms.random_resized_crop(
            image_size or c.image_size, c.norm_mean, c.norm_std, c.crop_scale, c.crop_ratio, on_device
        )

    def eval_transform(self, image_size=None):
        c = self.config
        return transforms.resize_center_crop(image_size or c.image_size, c.norm_mean, c.norm_std,
                                             c.eval_resize_ratio)
