"""Collapse telemetry on pooled representations z [B, D] (pure functions, float32)."""

from __future__ import annotations

import jax.numpy as jnp


def repr_std(z):
    """Mean over features of the batch standard deviation (ddof 0); 0 for a collapsed encoder."""
    z = jnp.asarray(z, jnp.float32)
    return jnp.mean(jnp.std(z, axis=0))


def repr_cov_offdiag(z):
    """sqrt(sum of squared off-diagonal entries of C / (D (D - 1))), C = zc^T zc / (B - 1)."""
    z = jnp.asarray(z, jnp.float32)
    b, d = z.shape
    zc = z - jnp.mean(z, axis=0, keepdims=True)
    cov = zc.T @ zc / max(b - 1, 1)
    off = jnp.sum(cov**2) - jnp.sum(jnp.diagonal(cov) ** 2)
    return jnp.sqrt(jnp.maximum(off, 0.0) / max(d * (d - 1), 1))


def masked_mean_pool(x, valid):
    """x [..., K, D], valid [..., K] -> mean over valid tokens [..., D]."""
    w = valid.astype(jnp.float32)[..., None]
    return jnp.sum(x.astype(jnp.float32) * w, axis=-2) / jnp.maximum(jnp.sum(w, axis=-2), 1.0)
