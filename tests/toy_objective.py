"""A toy objective for trainer tests: a linear JEPA on flattened pixels with an EMA target encoder.

It lives outside the package and is loaded by the trainer as 'toy_objective:make', which proves a
new objective needs no trainer code: only the Objective contract (docs/architecture.md).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jepa_cli.errors import InputError
from jepa_cli.objectives import telemetry
from jepa_cli.objectives.base import EMASpec


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    image_size: int = 8
    channels: int = 1
    dim: int = 16
    noise: float = 0.1  # input noise drawn from the step key (exercises the trainer's RNG)
    ema: tuple = (0.99, 1.0)
    total_updates: int | None = None
    diverge_at: int | None = None  # from this update on the loss is NaN
    collapse: bool = False  # the encoder ignores its input (constant representations)


class ToyObjective:
    name = "toy"

    def __init__(self, config: ToyConfig):
        self.config = config

    def to_config(self) -> dict:
        d = dataclasses.asdict(self.config)
        d["ema"] = list(d["ema"])
        return d

    def with_total_updates(self, total: int) -> "ToyObjective":
        return ToyObjective(dataclasses.replace(self.config, total_updates=int(total)))

    @property
    def features(self) -> int:
        return self.config.image_size * self.config.image_size * self.config.channels

    def init(self, key):
        k1, k2 = jax.random.split(key)
        f, d = self.features, self.config.dim
        return {
            "encoder": {"kernel": jax.random.normal(k1, (f, d)) * 0.1, "bias": jnp.zeros((d,))},
            "predictor": {"kernel": jnp.eye(d) + 0.01 * jax.random.normal(k2, (d, d)), "bias": jnp.zeros((d,))},
        }

    @property
    def ema_spec(self):
        e0, e1 = self.config.ema
        total = self.config.total_updates or 1
        return EMASpec(source="encoder", momentum=lambda s: jnp.minimum(e0 + jnp.asarray(s, jnp.float32) * (e1 - e0) / total, e1))

    def _encode(self, p, x):
        if self.config.collapse:
            x = x * 0.0
        return x @ p["kernel"] + p["bias"]

    def loss(self, params, ema, batch, key, step):
        x = batch["image"].reshape(batch["image"].shape[0], -1)
        noisy = x + self.config.noise * jax.random.normal(key, x.shape)
        z = self._encode(params["encoder"], noisy)
        pred = z @ params["predictor"]["kernel"] + params["predictor"]["bias"]
        target = jax.lax.stop_gradient(self._encode(ema, x))
        value = jnp.mean((pred - target) ** 2)
        if self.config.diverge_at is not None:
            value = value + jnp.where(step >= self.config.diverge_at, jnp.nan, 0.0)
        return value, telemetry.collapse_metrics(z, target)

    def weight_decay_mask(self, params):
        return jax.tree.map(lambda p: p.ndim > 1, params)

    def train_transform(self, image_size=None):
        size = self.config.image_size

        def fn(example, rng):
            img = np.asarray(example["image"], np.float32)[:size, :size] / 255.0
            shift = rng.uniform(-0.05, 0.05)
            return {"image": img + shift}

        return fn

    eval_transform = train_transform

    def encode(self, encoder_params, images, last_layers=1):
        x = images.reshape(images.shape[0], -1)
        return self._encode(encoder_params, x)[:, None, :]


def make(config: dict) -> ToyObjective:
    fields = {f.name for f in dataclasses.fields(ToyConfig)}
    for k in config:
        if k not in fields:
            raise InputError(f"unknown toy option {k!r}")
    config = dict(config)
    if "ema" in config:
        config["ema"] = tuple(config["ema"])
    return ToyObjective(ToyConfig(**config))
