"""Collapse telemetry on pooled representations z [B, D] (pure functions, float32)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jepa_cli.objectives.sigreg import sigreg

# SIGReg's directions come from fold_in(the update's key, this), a stream apart from the masks' (the key itself)
SIGREG_STREAM = 1


def repr_std(z):
    """Mean over features of the batch standard deviation (ddof 0); 0 for a collapsed encoder."""
    z = jnp.asarray(z, jnp.float32)
    return jnp.mean(jnp.std(z, axis=0))


def _offdiag_square_sum(z):
    """The sum of the squared off-diagonal entries of C = zc^T zc / (B - 1), zc = z [B, D] centred."""
    z = jnp.asarray(z, jnp.float32)
    zc = z - jnp.mean(z, axis=0, keepdims=True)
    cov = zc.T @ zc / max(z.shape[0] - 1, 1)
    return jnp.sum(cov**2) - jnp.sum(jnp.diagonal(cov) ** 2)


def repr_cov_offdiag(z):
    """sqrt(sum of squared off-diagonal entries of C / (D (D - 1))), C = zc^T zc / (B - 1)."""
    d = z.shape[1]
    return jnp.sqrt(jnp.maximum(_offdiag_square_sum(z), 0.0) / max(d * (d - 1), 1))


def variance_hinge(z, target: float = 1.0, eps: float = 1e-4):
    """VICReg's variance term (Bardes et al. 2022, eq. 1): mean over features of
    relu(target - sqrt(var + eps)), var the batch variance (ddof 1) of z [B, D]."""
    z = jnp.asarray(z, jnp.float32)
    std = jnp.sqrt(jnp.var(z, axis=0, ddof=1) + eps)
    return jnp.mean(jax.nn.relu(target - std))


def covariance_penalty(z):
    """VICReg's covariance term (Bardes et al. 2022, eq. 3): the sum of the squared off-diagonal
    entries of the batch covariance C = zc^T zc / (B - 1) of z [B, D], over D."""
    return _offdiag_square_sum(z) / z.shape[1]


def effective_rank(z):
    """exp(entropy) of the normalised eigenvalues of the batch covariance of z [B, D] (the effective
    rank of Roy & Vetterli 2007; RankMe, Garrido et al. 2023, takes the singular values of z itself):
    in [1, min(B - 1, D)], 1 for constant or rank-one features, D for isotropic ones. A value far
    below the width with a healthy `repr_std` is a dimensional (partial) collapse."""
    z = jnp.asarray(z, jnp.float32)
    zc = z - jnp.mean(z, axis=0, keepdims=True)
    eig = jnp.linalg.svd(zc, compute_uv=False) ** 2  # the covariance's eigenvalues, up to 1 / (B - 1)
    p = eig / jnp.maximum(jnp.sum(eig), jnp.finfo(jnp.float32).tiny)
    return jnp.exp(-jnp.sum(jax.scipy.special.xlogy(p, p)))


def collapse_metrics(context, target):
    """The aux metrics every JEPA objective logs, from pooled context-encoder features `context`
    [B, D] and pooled target-encoder features `target` [B, D] (gradients stopped here)."""
    context, target = jax.lax.stop_gradient(context), jax.lax.stop_gradient(target)
    return {"repr_std": repr_std(context), "repr_cov_offdiag": repr_cov_offdiag(context),
            "target_std": repr_std(target), "effective_rank": effective_rank(target)}


def masked_mean_pool(x, valid):
    """x [..., K, D], valid [..., K] -> mean over valid tokens [..., D]."""
    w = valid.astype(jnp.float32)[..., None]
    return jnp.sum(x.astype(jnp.float32) * w, axis=-2) / jnp.maximum(jnp.sum(w, axis=-2), 1.0)


def sigreg_samples(placement: str, pooled, context, context_valid, predictions, target_valid):
    """(rows [N, D], valid bool [N] or None): the samples SIGReg is taken over for `placement`
    (objectives/ijepa_config.py SIGREG_PLACEMENTS): "pooled", the context encoder's pooled features
    pooled [B, D], every row; "tokens", every valid context token of context [B, C, K, D] with
    context_valid [B, C, K]; "predictions", every valid predicted token of predictions [B, M, T, D]
    with target_valid [B, M, T]."""
    if placement == "pooled":
        return pooled, None
    tokens, valid = (context, context_valid) if placement == "tokens" else (predictions, target_valid)
    return tokens.reshape(-1, tokens.shape[-1]), valid.reshape(-1)


def with_anticollapse(prediction_loss, pooled, config, key, sigreg_rows=None, sigreg_valid=None):
    """The loss of a JEPA objective with its anti-collapse terms (`config`'s var_weight, var_target,
    cov_weight and sigreg_*; objectives/ijepa_config.py): prediction_loss + var_weight x
    variance_hinge(pooled, var_target) + cov_weight x covariance_penalty(pooled) + sigreg_weight x
    sigreg(sigreg_rows [N, D] where valid, directions from `key`), pooled [B, D] the context encoder's
    pooled features, sigreg_rows and sigreg_valid bool [N] (sigreg_samples) by default pooled, every
    row, `key` the update's; and the aux entries `var_loss`, `cov_loss`, `sigreg` (the terms that are
    on, unweighted) and `pred_loss`, none when every weight is 0. A weight of 0 is a Python branch: the
    loss is then the prediction loss itself, bit for bit (the official recipes)."""
    value, regularisers = prediction_loss, {}
    if config.var_weight:
        regularisers["var_loss"] = variance_hinge(pooled, config.var_target)
        value = value + config.var_weight * regularisers["var_loss"]
    if config.cov_weight:
        regularisers["cov_loss"] = covariance_penalty(pooled)
        value = value + config.cov_weight * regularisers["cov_loss"]
    if config.sigreg_weight:
        rows = pooled if sigreg_rows is None else sigreg_rows
        regularisers["sigreg"] = sigreg(rows, jax.random.fold_in(key, SIGREG_STREAM), config.sigreg_slices,
                                        config.sigreg_knots, config.sigreg_t_max, sigreg_valid)
        value = value + config.sigreg_weight * regularisers["sigreg"]
    if regularisers:
        regularisers["pred_loss"] = prediction_loss
    return value, regularisers
