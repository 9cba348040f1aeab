"""What the generative objectives (flow.py, diffusion.py) share: the class-conditional DiT on
images or latents, the data transforms, label dropout, the whole-tree EMA, and the interface the
samplers (jepa_cli.sampling) use.

Sampler interface (every objective that has it is "generative"):
- `sampling_grid(steps) -> np.ndarray float64 [steps + 1]`: the time grid, from pure noise down to 0;
  `sampling_times(steps)`: the same in float32, as the sampler steps it;
- `prior(key, shape)`: x at the first time;
- `predict(params, x, time [B], labels [B]) -> raw`: the network output in the prediction's space;
- `to_x0_eps(raw, x, time) -> (x0, eps)`, `alpha_sigma(time)` with x = alpha x0 + sigma eps;
- `derivative(raw, x, time)`: dx/dtime of the probability-flow ODE (Euler/Heun);
- `guidance_levels(steps) -> np.ndarray float64 [steps + 1]`: the noise level a guidance interval is on
  (t for flow, sigma for diffusion) at each grid point.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jepa_cli.data import transforms
from jepa_cli.errors import InputError
from jepa_cli.models import ModuleTemplate
from jepa_cli.models.config import as_pair
from jepa_cli.models.vit import DTYPES
from jepa_cli.objectives.base import EMASpec, decay_matrices_only
from jepa_cli.objectives.genconfig import MODALITIES, GenerativeConfig, config_notes


def ema_decay(step, decay: float, power: float | None):
    """The EMA decay after update `step` (0-based): constant `decay`, or EDM2's power-function
    profile beta(t) = (1 - 1/t)^(gamma + 1) at t = step + 1 (Karras et al. 2024, Sec. 3.1, eq. 3)."""
    step = jnp.asarray(step, jnp.float32)
    if power is None:
        return jnp.asarray(decay, jnp.float32) + 0.0 * step
    t = step + 1.0
    return (1.0 - 1.0 / t) ** (power + 1.0)


class GenerativeObjective:
    name = "generative"
    config_class = GenerativeConfig
    modalities = ("image", "latent")
    generative = True

    def __init__(self, config: GenerativeConfig | None = None):
        self.config = config or self.config_class()
        c = self.config
        self.null_class = c.num_classes
        if c.modality == "image":
            h, w = as_pair(c.image_size)
            p = c.patch_size
            self.grid = (h // p, w // p)
            self.sample_shape = (h, w, c.channels)
            token_dim = p * p * c.channels
        else:
            shape = tuple(c.latent_shape)
            self.sample_shape = shape
            if len(shape) == 2:
                self.grid = (shape[0],)
                token_dim = shape[1]
            else:
                k = c.latent_tokens or next(k for k in (8, 4, 2, 1) if shape[0] % k == 0)
                self.grid = (k,)
                token_dim = shape[0] // k
        from jepa_cli.models.dit import DiT

        # mixer arguments only for a stack with an S5 block: an attention-only DiT is built as it always was
        mixing = {} if set(c.mixers) == {"attn"} else dict(mixers=c.mixers, ssm_state=c.ssm_state, ssm_step=c.ssm_step,
                                                             scan_order=c.scan_order)
        self._dit = ModuleTemplate(lambda rngs: DiT(
            in_dim=token_dim, out_dim=token_dim, grid=self.grid, width=c.width, depth=c.depth, heads=c.heads,
            num_classes=c.num_classes, mlp_ratio=c.mlp_ratio, dtype=DTYPES[c.dtype], rngs=rngs, **mixing),
            key=("dit", token_dim, self.grid, c.width, c.depth, c.heads, c.num_classes, c.mlp_ratio, c.dtype,
                 tuple(sorted(mixing.items()))))

    # -- configuration ---------------------------------------------------------------------------
    @property
    def uses_labels(self) -> bool:
        return self.config.num_classes > 0

    @classmethod
    def from_config(cls, config: dict):
        return cls(cls.config_class.from_dict(dict(config)))

    def to_config(self) -> dict:
        return self.config.to_dict()

    def with_total_updates(self, total_updates: int):
        return self  # no schedule of its own depends on the run length

    @classmethod
    def dataset_options(cls, ds: dict) -> dict:
        """Image datasets: channels and size; latent datasets: shape, shift and scale. Both: the
        number of classes (0 without labels: an unconditional model)."""
        attrs = ds.get("attrs") or {}
        if ds["modality"] not in MODALITIES:
            raise InputError(f"flow and diffusion train on images or latents; the dataset given (--data) is "
                             f"{ds['modality']} (encode it into latents first: jepa encode-latents)")
        out: dict[str, Any] = {"num_classes": int(ds.get("num_classes") or 0)}
        if ds["modality"] == "image":
            out.update(channels=ds["channels"],
                       image_size=ds["height"] if ds["height"] == ds["width"] else [ds["height"], ds["width"]])
        elif ds["modality"] == "latent":
            out["latent_shape"] = list(ds["shape"])
            for key in ("latent_shift", "latent_scale"):
                if attrs.get(key) is not None:
                    out[key] = [float(v) for v in attrs[key]]
        out["modality"] = ds["modality"]  # last: the trainer adds these one by one, each must be valid
        return out

    @classmethod
    def config_notes(cls, table: dict[str, Any]) -> dict[str, str]:
        """Notes for `jepa train --print-config` beside options of the resolved `table` whose value came
        from the data ({key: note}; genconfig.config_notes)."""
        return config_notes(cls.name, table)

    # -- parameters ------------------------------------------------------------------------------
    def init(self, key) -> dict:
        return {"dit": self._dit.init(key)}

    @property
    def ema_spec(self) -> EMASpec:
        decay, power = self.config.ema_decay, self.config.ema_power
        return EMASpec(source=None, momentum=lambda step: ema_decay(step, decay, power))

    def weight_decay_mask(self, params):
        """Decay matrices only: not biases, norms or 1-D leaves."""
        return decay_matrices_only(params, ("bias", "zero_bias"))

    # -- data ----------------------------------------------------------------------------------
    @property
    def data_key(self) -> str:
        return self.config.modality

    def latent_norm(self):
        c = self.config
        d = self.sample_shape[-1]
        shift = np.asarray(c.latent_shift if c.latent_shift is not None else [0.0] * d, np.float32)
        scale = np.asarray(c.latent_scale if c.latent_scale is not None else [1.0] * d, np.float32)
        return shift, scale

    def train_transform(self, image_size=None, on_device: bool = False):
        """Images: uint8 -> [-1, 1] at the model's size; latents: (z - shift) * scale. Normalised on
        the host whatever `on_device` says."""
        if self.config.modality == "image":
            return transforms.resize_center_crop(image_size or self.config.image_size, (0.5,) * self.config.channels,
                                                 (0.5,) * self.config.channels, resize_ratio=1.0)
        shift, scale = self.latent_norm()

        def latent(example, rng=None):
            out = dict(example)
            out["latent"] = ((np.asarray(example["latent"], np.float32) - shift) * scale).astype(np.float32)
            return out

        return latent

    eval_transform = train_transform

    def to_data(self, x: np.ndarray) -> np.ndarray:
        """Model space -> the dataset's values: uint8 images or float32 latents (z / scale + shift)."""
        x = np.asarray(x, np.float32)
        if self.config.modality == "image":
            return np.clip(np.round((x + 1.0) * 127.5), 0, 255).astype(np.uint8)
        shift, scale = self.latent_norm()
        return (x / scale + shift).astype(np.float32)

    # -- the network ----------------------------------------------------------------------------
    def _to_tokens(self, x):
        b = x.shape[0]
        if self.config.modality == "image":
            (gh, gw), p = self.grid, self.config.patch_size
            c = x.shape[-1]
            return x.reshape(b, gh, p, gw, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, gh * gw, p * p * c)
        return x.reshape(b, self.grid[0], -1)

    def _from_tokens(self, tokens):
        b = tokens.shape[0]
        if self.config.modality == "image":
            (gh, gw), p = self.grid, self.config.patch_size
            c = self.sample_shape[-1]
            return tokens.reshape(b, gh, gw, p, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, *self.sample_shape)
        return tokens.reshape(b, *self.sample_shape)

    def network(self, params, x, noise_level, labels):
        """The DiT on x [B, *sample_shape] -> the same shape, float32."""
        dit = self._dit.merge(params["dit"])
        return self._from_tokens(dit(self._to_tokens(x), noise_level, labels))

    def _labels(self, batch, key, b):
        """The batch's labels with each dropped to the null class with probability cond_drop."""
        if not self.uses_labels:
            return jnp.full((b,), self.null_class, jnp.int32)
        y = batch["label"].astype(jnp.int32)
        drop = jax.random.uniform(key, (b,)) < self.config.cond_drop
        return jnp.where(drop, self.null_class, y)

    def encode(self, encoder_params, images, last_layers: int = 1):
        raise InputError(f"objective {self.name!r} is generative; it has no encoder (sample with jepa sample)")

    # -- sampling (see the module docstring) -----------------------------------------------------
    def prior(self, key, shape):
        return jax.random.normal(key, shape, jnp.float32)

    def guidance_range(self) -> tuple[float, float]:
        return 0.0, float("inf")

    def derivative(self, raw, x, time):
        """dx/dtime with x = alpha x0 + sigma eps and the predictions held fixed."""
        x0, eps = self.to_x0_eps(raw, x, time)
        da, ds = self.alpha_sigma_derivative(time)
        return da * x0 + ds * eps


def expand(v, x):
    """A per-example scalar [B] (or a scalar) broadcast against x [B, ...]."""
    v = jnp.asarray(v, jnp.float32)
    return v.reshape(v.shape + (1,) * (x.ndim - v.ndim)) if v.ndim else v

