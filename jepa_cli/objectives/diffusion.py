"""Diffusion with a continuous cosine schedule (eps / x0 / v prediction) or EDM preconditioning.

cosine (VP, Nichol & Dhariwal 2021 without the offset, continuous): x_t = alpha x0 + sigma eps with
alpha = cos(pi t / 2), sigma = sin(pi t / 2), t ~ U(T_MIN, T_MAX). The network predicts eps, x0 or
v = alpha eps - sigma x0 (Salimans & Ho 2022) and the loss is the MSE in that space.

edm (Karras et al. 2022, Table 1): x = x0 + sigma eps, ln sigma ~ N(P_mean, P_std) (genconfig.EDM_PRESETS),
D(x) = c_skip x + c_out F(c_in x, c_noise) with c_skip = sd^2 / (s^2 + sd^2), c_out = s sd / sqrt(s^2 + sd^2),
c_in = 1 / sqrt(s^2 + sd^2), c_noise = ln(s) / 4; the loss is the MSE of F against
(x0 - c_skip x) / c_out, which is EDM's lambda(sigma)-weighted x0 loss.

EDM2's learned uncertainty (Karras et al. 2024, Sec. 2 and App. B.2; training_loop.py EDM2Loss,
networks_edm2.py Precond's logvar head), with `edm_logvar`: u(sigma) = w . fourier(c_noise) + b, the
Fourier features as MPFourier's (sqrt(2) cos(2 pi (f c_noise + phi)), f ~ N(0, 1), phi ~ U(0, 1), fixed),
and the loss weight lambda |D - x0|^2 / exp(u) + u: the network learns to down-weight noise levels
whose error it cannot reduce. The head starts at zero (u = 0), so the first loss equals the plain one.

min-SNR-gamma (Hang et al. 2023) weights the x0 loss by min(SNR, gamma); in the space the loss is
computed in it becomes min(SNR, gamma) times |d x0 / d prediction|^2: 1 for x0, 1/SNR for eps,
1/(SNR + 1) for v, c_out^2 for EDM's F.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jepa_cli.objectives.genconfig import EDM_SIGMA_DATA, DiffusionConfig
from jepa_cli.objectives.generative import GenerativeObjective, expand

T_MIN, T_MAX = 1e-3, 1.0 - 1e-3  # cosine: keep alpha and sigma away from 0
TIME_SCALE = 1000.0  # the time embedding sees 1000 t (cosine) or 1000 c_noise (edm)
SIGMA_MIN, SIGMA_MAX, RHO = 0.002, 80.0, 7.0  # EDM sampling grid at sigma_data 0.5 (Karras et al. 2022, Table 1)
LOGVAR_CHANNELS = 128  # Fourier features of the logvar head (networks_edm2.py Precond, logvar_channels=128)
LOGVAR_SEED = 0  # the fixed frequencies and phases of those features (buffers, never trained, in EDM2)


def cosine_alpha_sigma(t):
    """alpha = cos(pi t / 2), sigma = sin(pi t / 2): alpha(0) = 1, sigma(0) = 0, alpha(1) = 0, sigma(1) = 1."""
    return jnp.cos(0.5 * math.pi * t), jnp.sin(0.5 * math.pi * t)


def edm_preconditioning(sigma, sigma_data: float):
    """(c_skip, c_out, c_in, c_noise) of Karras et al. 2022, Table 1."""
    s2 = sigma * sigma + sigma_data**2
    return sigma_data**2 / s2, sigma * sigma_data / jnp.sqrt(s2), 1.0 / jnp.sqrt(s2), jnp.log(sigma) / 4.0


def karras_sigmas(steps: int, sigma_min=SIGMA_MIN, sigma_max=SIGMA_MAX, rho=RHO, dtype=np.float32) -> np.ndarray:
    """EDM eq. 5: sigma_i = (smax^(1/rho) + i/(K-1) (smin^(1/rho) - smax^(1/rho)))^rho, then 0: [K + 1],
    computed in float64 and returned as `dtype`."""
    i = np.arange(steps, dtype=np.float64)
    ramp = i / max(steps - 1, 1)
    s = (sigma_max ** (1 / rho) + ramp * (sigma_min ** (1 / rho) - sigma_max ** (1 / rho))) ** rho
    return np.append(s, 0.0).astype(dtype)


def min_snr_weight(snr, gamma: float | None, space: str, c_out=None):
    """The min-SNR-gamma weight (Hang et al. 2023, eq. 8: min(SNR, gamma) on the x0 loss) expressed
    in the loss's own space; 1 (no reweighting) when gamma is None."""
    if gamma is None:
        return jnp.ones_like(snr)
    base = jnp.minimum(snr, gamma)
    if space == "x0":
        return base
    if space == "eps":  # |eps err|^2 = SNR |x0 err|^2
        return base / snr
    if space == "v":  # |v err|^2 = (SNR + 1) |x0 err|^2 (alpha^2 + sigma^2 = 1)
        return base / (snr + 1.0)
    if space == "edm":  # |D err|^2 = c_out^2 |F err|^2
        return base * c_out * c_out
    raise ValueError(space)


def logvar_features(c_noise, freqs, phases):
    """EDM2's MPFourier: sqrt(2) cos(2 pi (freqs c_noise + phases)), [B] -> [B, F], unit mean square."""
    return math.sqrt(2.0) * jnp.cos(2.0 * math.pi * (jnp.outer(c_noise, freqs) + phases))


class DiffusionObjective(GenerativeObjective):
    name = "diffusion"
    config_class = DiffusionConfig

    def __init__(self, config: DiffusionConfig | None = None):
        super().__init__(config)
        rng = np.random.default_rng(LOGVAR_SEED)
        self._logvar_freqs = rng.standard_normal(LOGVAR_CHANNELS).astype(np.float32)
        self._logvar_phases = rng.random(LOGVAR_CHANNELS).astype(np.float32)

    def init(self, key) -> dict:
        """The DiT; with edm_logvar also the logvar head {"weight" [F], "bias" []}, both zero."""
        params = super().init(key)
        if self.config.edm_logvar:
            params["logvar"] = {"weight": jnp.zeros((LOGVAR_CHANNELS,), jnp.float32),
                                "bias": jnp.zeros((), jnp.float32)}
        return params

    def logvar(self, params, sigma):
        """u(sigma) [B] of the logvar head (edm_logvar), on c_noise = ln(sigma) / 4 as the DiT sees it."""
        head = params["logvar"]
        features = logvar_features(jnp.log(sigma) / 4.0, self._logvar_freqs, self._logvar_phases)
        return features @ head["weight"] + head["bias"]

    @property
    def prediction(self) -> str:
        if self.config.schedule == "edm":
            return "edm"
        return self.config.prediction or "v"

    def loss(self, params, ema, batch, key, step):
        c = self.config
        x0 = batch[self.data_key].astype(jnp.float32)
        b = x0.shape[0]
        k_t, k_eps, k_drop = jax.random.split(key, 3)
        eps = jax.random.normal(k_eps, x0.shape, jnp.float32)
        labels = self._labels(batch, k_drop, b)
        if c.schedule == "edm":
            sigma = jnp.exp(c.p_mean + c.p_std * jax.random.normal(k_t, (b,), jnp.float32))
            x = x0 + expand(sigma, x0) * eps
            c_skip, c_out, _, _ = edm_preconditioning(sigma, c.sigma_data)
            raw = self.predict(params, x, sigma, labels)
            target = (x0 - expand(c_skip, x0) * x) / expand(c_out, x0)
            snr = 1.0 / (sigma * sigma)
            w = min_snr_weight(snr, c.min_snr_gamma, "edm", c_out)
            level = sigma
        else:
            t = jax.random.uniform(k_t, (b,), jnp.float32, T_MIN, T_MAX)
            alpha, sigma = cosine_alpha_sigma(t)
            x = expand(alpha, x0) * x0 + expand(sigma, x0) * eps
            raw = self.predict(params, x, t, labels)
            target = {"eps": eps, "x0": x0, "v": expand(alpha, x0) * eps - expand(sigma, x0) * x0}[self.prediction]
            snr = (alpha / sigma) ** 2
            w = min_snr_weight(snr, c.min_snr_gamma, self.prediction)
            level = sigma / alpha
        per_example = jnp.mean(jnp.square(raw - target).reshape(b, -1), axis=1)
        if c.edm_logvar:  # EDM2Loss: weight |D - x0|^2 / exp(u) + u, per element (the mean over them here)
            u = self.logvar(params, sigma)
            value = jnp.mean(w * per_example * jnp.exp(-u) + u)
            return value, {"loss": value, "sigma_mean": jnp.mean(level), "logvar_mean": jnp.mean(u)}
        value = jnp.mean(w * per_example)
        return value, {"loss": value, "sigma_mean": jnp.mean(level)}

    # -- sampling ------------------------------------------------------------------------------
    def sigma_range(self) -> tuple[float, float]:
        """EDM's (sigma_min, sigma_max) at the run's sigma_data: 0.002 and 80 are published with
        sigma_data 0.5 (EDM Table 1; EDM2's latents of std 0.5, NVlabs/edm2 training/encoders.py), so
        they scale with it, keeping sigma / sigma_data in [0.004, 160]."""
        scale = self.config.sigma_data / EDM_SIGMA_DATA
        return SIGMA_MIN * scale, SIGMA_MAX * scale

    def sampling_grid(self, steps: int) -> np.ndarray:
        """float64 [K + 1]: EDM's sigmas over sigma_range, or the cosine schedule's t evenly from T_MAX
        down to 0."""
        if self.config.schedule == "edm":
            return karras_sigmas(steps, *self.sigma_range(), dtype=np.float64)
        return np.linspace(T_MAX, 0.0, steps + 1)

    def sampling_times(self, steps: int) -> np.ndarray:
        """The grid as the sampler steps it: float32 [K + 1]."""
        return self.sampling_grid(steps).astype(np.float32)

    def prior(self, key, shape):
        scale = self.sigma_range()[1] if self.config.schedule == "edm" else 1.0
        return scale * jax.random.normal(key, shape, jnp.float32)

    def predict(self, params, x, time, labels):
        if self.config.schedule == "edm":
            _, _, c_in, c_noise = edm_preconditioning(time, self.config.sigma_data)
            return self.network(params, expand(c_in, x) * x, c_noise * TIME_SCALE, labels)
        return self.network(params, x, time * TIME_SCALE, labels)

    def alpha_sigma(self, time):
        if self.config.schedule == "edm":
            return jnp.ones_like(time), time
        return cosine_alpha_sigma(time)

    def alpha_sigma_derivative(self, time):
        if self.config.schedule == "edm":
            return jnp.zeros_like(time), jnp.ones_like(time)
        return -0.5 * math.pi * jnp.sin(0.5 * math.pi * time), 0.5 * math.pi * jnp.cos(0.5 * math.pi * time)

    def to_x0_eps(self, raw, x, time):
        alpha, sigma = (expand(v, x) for v in self.alpha_sigma(time))
        kind = self.prediction
        if kind == "edm":
            c_skip, c_out, _, _ = edm_preconditioning(time, self.config.sigma_data)
            x0 = expand(c_skip, x) * x + expand(c_out, x) * raw
            return x0, (x - x0) / sigma
        if kind == "eps":
            return (x - sigma * raw) / alpha, raw
        if kind == "x0":
            return raw, (x - alpha * raw) / sigma
        return alpha * x - sigma * raw, sigma * x + alpha * raw  # v

    def guidance_levels(self, steps: int) -> np.ndarray:
        """float64 [K + 1]: sigma in EDM's sense (noise over signal) at each grid point: sigma itself for
        edm, sigma / alpha = tan(pi t / 2) for cosine."""
        grid = self.sampling_grid(steps)
        if self.config.schedule == "edm":
            return grid
        return np.tan(0.5 * math.pi * grid)


def make(config: dict) -> DiffusionObjective:
    return DiffusionObjective.from_config(config)
