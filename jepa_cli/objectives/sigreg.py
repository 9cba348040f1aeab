"""SIGReg, LeJEPA's Sketched Isotropic Gaussian Regulariser (Balestriero & LeCun 2025, arXiv 2511.08544):
the Epps-Pulley statistic of random 1-D projections of embeddings against the standard normal, as
rbalestr-lab/lejepa computes it (MINIMAL.md `SIGReg`, lejepa/univariate/epps_pulley.py `EppsPulley`,
lejepa/multivariate/slicing.py `SlicingUnivariateTest`). Pure functions, float32.

For a projection x [N] the statistic is N x the integral over t of |ecf(t) - exp(-t^2/2)|^2 exp(-t^2/2),
ecf(t) = mean_n exp(i t x_n); the integrand is even in t, so it is integrated on [0, t_max] with the
trapezoid rule and doubled. Every mean is over the batch axis of the (global) array: under jit with a
batch sharded over a mesh it is the mean over the global batch, as the reference's all-reduce of the
per-rank means times N x world size.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# lejepa/univariate/epps_pulley.py EppsPulley(t_max=3, n_points=17); MINIMAL.md draws 256 slices
NUM_SLICES, NUM_KNOTS, T_MAX = 256, 17, 3.0


def quadrature(num_knots: int = NUM_KNOTS, t_max: float = T_MAX):
    """(knots t [K], window exp(-t^2/2) [K], weights [K]): K knots evenly on [0, t_max], trapezoid
    weights doubled for the negative half (dt at both ends, 2 dt inside) times the window
    (epps_pulley.py EppsPulley.__init__)."""
    t = jnp.linspace(0.0, t_max, num_knots, dtype=jnp.float32)
    dt = t_max / (num_knots - 1)
    trapezoid = jnp.full((num_knots,), 2 * dt, jnp.float32).at[jnp.array([0, -1])].set(dt)
    window = jnp.exp(-jnp.square(t) / 2.0)
    return t, window, trapezoid * window


def epps_pulley_sliced(embeddings, directions, num_knots: int = NUM_KNOTS, t_max: float = T_MAX, valid=None):
    """Mean over the M slices of the Epps-Pulley statistic of embeddings [N, D] projected on
    directions [D, M] (columns of unit norm), a scalar (MINIMAL.md SIGReg.forward). With `valid`
    bool [N], the statistic of the valid rows alone (static shapes: the empirical CF is the
    valid-weighted mean and the factor N the count of valid rows; 0 when no row is valid)."""
    t, window, weights = quadrature(num_knots, t_max)
    x = jnp.asarray(embeddings, jnp.float32) @ jnp.asarray(directions, jnp.float32)  # [N, M]
    xt = x[..., None] * t  # [N, M, K]
    if valid is None:
        cos_mean = jnp.mean(jnp.cos(xt), axis=0)  # [M, K], the real part of the empirical CF
        sin_mean = jnp.mean(jnp.sin(xt), axis=0)  # [M, K], its imaginary part
        count = x.shape[0]  # the (global) batch size N
    else:
        w = jnp.asarray(valid, jnp.float32)[:, None, None]  # [N, 1, 1]
        count = jnp.sum(w)
        cos_mean = jnp.sum(jnp.cos(xt) * w, axis=0) / jnp.maximum(count, 1.0)
        sin_mean = jnp.sum(jnp.sin(xt) * w, axis=0) / jnp.maximum(count, 1.0)
    err = jnp.square(cos_mean - window) + jnp.square(sin_mean)  # [M, K]; the normal's CF is real
    statistic = (err @ weights) * count  # [M], times the number of samples
    return jnp.mean(statistic)


def random_directions(key, dim: int, num_slices: int = NUM_SLICES):
    """[dim, num_slices] Gaussian columns scaled to unit norm (slicing.py: randn, A /= A.norm(dim=0))."""
    a = jax.random.normal(key, (dim, num_slices), jnp.float32)
    return a / jnp.linalg.norm(a, axis=0, keepdims=True)


def sigreg(embeddings, key, num_slices: int = NUM_SLICES, num_knots: int = NUM_KNOTS, t_max: float = T_MAX,
           valid=None):
    """SIGReg of embeddings [N, D] on num_slices directions drawn from `key` (a new key each update
    draws new directions, as the reference redraws them every step): a scalar, about 1 for a standard
    normal batch whatever N, of order N for a collapsed or mis-scaled one. `valid` bool [N]: over the
    valid rows only (epps_pulley_sliced)."""
    directions = random_directions(key, embeddings.shape[-1], num_slices)
    return epps_pulley_sliced(embeddings, directions, num_knots, t_max, valid)
