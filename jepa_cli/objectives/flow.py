"""Flow matching (Lipman et al. 2023; Liu et al. 2023) on the linear path, as SD3 (Esser et al. 2024).

x_t = (1 - t) x_0 + t eps (t = 0 data, t = 1 noise), the network predicts the velocity
u = dx_t/dt = eps - x_0 with a plain MSE; t is logit-normal (SD3 Sec. 3.1: t = sigmoid(m + s n)) and
then shifted t' = s t / (1 + (s - 1) t) (SD3 Sec. 5.3.2, "resolution-dependent shifting").
Sampling integrates dx/dt = v from t = 1 to t = 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jepa_cli.objectives.genconfig import FlowConfig
from jepa_cli.objectives.generative import GenerativeObjective, expand

TIME_SCALE = 1000.0  # t in [0, 1] enters the sinusoidal embedding as 1000 t (DiT's timesteps)


def shift_time(t, s: float):
    """SD3's shift: t' = s t / (1 + (s - 1) t); s = 1 is the identity, s > 1 moves t towards noise."""
    return s * t / (1.0 + (s - 1.0) * t)


def logit_normal_time(key, shape, mean: float, std: float):
    """t = sigmoid(mean + std n), n ~ N(0, 1) (SD3 eq. 19)."""
    return jax.nn.sigmoid(mean + std * jax.random.normal(key, shape, jnp.float32))


class FlowObjective(GenerativeObjective):
    name = "flow"
    config_class = FlowConfig

    def loss(self, params, ema, batch, key, step):
        c = self.config
        x0 = batch[self.data_key].astype(jnp.float32)
        b = x0.shape[0]
        k_t, k_eps, k_drop = jax.random.split(key, 3)
        t = shift_time(logit_normal_time(k_t, (b,), c.logit_mean, c.logit_std), c.flow_shift)
        eps = jax.random.normal(k_eps, x0.shape, jnp.float32)
        xt = (1.0 - expand(t, x0)) * x0 + expand(t, x0) * eps
        target = eps - x0
        pred = self.network(params, xt, t * TIME_SCALE, self._labels(batch, k_drop, b))
        value = jnp.mean(jnp.square(pred - target))
        return value, {"loss": value, "t_mean": jnp.mean(t)}

    # -- sampling ------------------------------------------------------------------------------
    def sampling_grid(self, steps: int) -> np.ndarray:
        """float64 t_i = shift(1 - i / K), i = 0..K: from noise (1) to data (0), shifted as in training."""
        u = 1.0 - np.arange(steps + 1, dtype=np.float64) / steps
        return shift_time(u, self.config.flow_shift)

    def sampling_times(self, steps: int) -> np.ndarray:
        """The grid as the sampler steps it: float32 [K + 1]."""
        return self.sampling_grid(steps).astype(np.float32)

    def predict(self, params, x, time, labels):
        return self.network(params, x, time * TIME_SCALE, labels)

    def alpha_sigma(self, time):
        return 1.0 - time, time

    def to_x0_eps(self, raw, x, time):
        t = expand(time, x)
        return x - t * raw, x + (1.0 - t) * raw

    def derivative(self, raw, x, time):
        return raw  # the velocity itself

    def guidance_levels(self, steps: int) -> np.ndarray:
        """float64 [K + 1]: the guidance interval is on t itself."""
        return self.sampling_grid(steps)

    def guidance_range(self):
        return 0.0, 1.0


def make(config: dict) -> FlowObjective:
    return FlowObjective.from_config(config)
