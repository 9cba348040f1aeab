"""Linear probe: standardised features, multinomial logistic regression trained in JAX.

Full-batch L-BFGS (optax.lbfgs with its zoom line search) on the mean cross-entropy plus
`wd / 2 * ||W||^2` (the bias is not decayed): deterministic, no learning rate to tune, and fast
for the sizes probes see (60,000 x 384 features fit in memory on any device). The weight decay is
chosen from a small grid by top-1 accuracy on a held-out part of TRAIN (ties: lower held-out loss),
then the probe is refit on all of TRAIN with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Sequence

import jax
import numpy as np

from jepa_cli.evaluation.features import topk_accuracy

WEIGHT_DECAYS: tuple[float, ...] = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
HOLDOUT_FRACTION = 0.2
MAX_ITER = 100


@dataclass
class LinearProbe:
    mean: np.ndarray
    inv_std: np.ndarray
    w: np.ndarray
    b: np.ndarray
    weight_decay: float
    selection: dict[str, float]  # str(weight decay) -> held-out top-1

    def logits(self, x: np.ndarray) -> np.ndarray:
        return ((x - self.mean) * self.inv_std) @ self.w + self.b


def standardiser(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and 1/std of `x`; constant features get a scale of 0."""
    mean = x.mean(axis=0, dtype=np.float64)
    std = x.std(axis=0, dtype=np.float64)
    inv = np.where(std > 1e-6, 1.0 / np.maximum(std, 1e-6), 0.0)
    return mean.astype(np.float32), inv.astype(np.float32)


@partial(jax.jit, static_argnames=("num_classes", "max_iter"))
def _fit(x, y, sample_weight, weight_decay, num_classes: int, max_iter: int):
    import jax.numpy as jnp
    import optax
    import optax.tree_utils as otu

    d = x.shape[1]
    params = {"w": jnp.zeros((d, num_classes), jnp.float32), "b": jnp.zeros((num_classes,), jnp.float32)}

    def loss(p):
        logits = x @ p["w"] + p["b"]
        nll = jax.nn.logsumexp(logits, axis=1) - jnp.take_along_axis(logits, y[:, None], axis=1)[:, 0]
        return jnp.sum(nll * sample_weight) / jnp.sum(sample_weight) + 0.5 * weight_decay * jnp.sum(p["w"] ** 2)

    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(loss)

    def step(carry):
        p, state = carry
        value, grad = value_and_grad(p, state=state)
        updates, state = opt.update(grad, state, p, value=value, grad=grad, value_fn=loss)
        return optax.apply_updates(p, updates), state

    def keep_going(carry):
        _, state = carry
        count = otu.tree_get(state, "count")
        grad = otu.tree_get(state, "grad")
        norm = otu.tree_norm(grad)
        return (count == 0) | ((count < max_iter) & (norm >= 1e-5))

    params, _ = jax.lax.while_loop(keep_going, step, (params, opt.init(params)))
    return params


def _train(x: np.ndarray, y: np.ndarray, weight: np.ndarray, wd: float, num_classes: int, max_iter: int):
    """Fits on the rows with weight 1 (the held-out rows get 0): one shape, one compilation."""
    import jax.numpy as jnp

    p = _fit(jnp.asarray(x), jnp.asarray(y, jnp.int32), jnp.asarray(weight, jnp.float32), jnp.float32(wd),
             num_classes, max_iter)
    return np.asarray(p["w"]), np.asarray(p["b"])


def _scores(logits: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Top-1 accuracy and mean cross-entropy."""
    logits = logits.astype(np.float64)
    z = logits - logits.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=1))
    nll = lse - z[np.arange(len(y)), y]
    return float((logits.argmax(axis=1) == y).mean()), float(np.nan_to_num(nll, nan=np.inf).mean())


def fit_linear(x: np.ndarray, y: np.ndarray, num_classes: int, weight_decays: Sequence[float] = WEIGHT_DECAYS,
               holdout_fraction: float = HOLDOUT_FRACTION, seed: int = 0, max_iter: int = MAX_ITER,
               on_step: Callable[[str], None] | None = None) -> LinearProbe:
    """Fits the probe on `x` [N, D], `y` [N]; chooses the weight decay on a held-out part of it."""
    x = np.asarray(x, np.float32)
    y = np.asarray(y, np.int32)
    mean, inv = standardiser(x)
    xs = (x - mean) * inv
    selection: dict[str, float] = {}
    weight_decays = list(weight_decays)
    n_hold = int(round(len(x) * holdout_fraction))
    if len(weight_decays) > 1 and n_hold >= 1 and len(x) - n_hold >= 2:
        perm = np.random.default_rng(seed).permutation(len(x))
        hold = perm[:n_hold]
        weight = np.ones(len(x), np.float32)
        weight[hold] = 0.0
        best = None
        for wd in weight_decays:
            if on_step:
                on_step(f"weight decay {wd:g}")
            w, b = _train(xs, y, weight, wd, num_classes, max_iter)
            acc, nll = _scores(xs[hold] @ w + b, y[hold])
            selection[f"{wd:g}"] = acc
            key = (acc, -nll)
            if best is None or key > best[0]:
                best = (key, wd)
        chosen = best[1]
    else:
        chosen = weight_decays[len(weight_decays) // 2]
    if on_step:
        on_step(f"refit with weight decay {chosen:g}")
    w, b = _train(xs, y, np.ones(len(x), np.float32), chosen, num_classes, max_iter)
    return LinearProbe(mean, inv, w, b, float(chosen), selection)


def rank_classes(scores: np.ndarray, k: int = 5) -> np.ndarray:
    """Class indices by descending score, `[N, min(k, C)]`; ties go to the lower class index."""
    order = np.argsort(-scores, axis=1, kind="stable")
    return order[:, : min(k, scores.shape[1])]


def linear_probe(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
                 num_classes: int, seed: int = 0, weight_decays: Sequence[float] = WEIGHT_DECAYS,
                 max_iter: int = MAX_ITER, on_step: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Fits on TRAIN, scores TEST: top-1/top-5 (fractions; top-5 None for 5 classes or fewer,
    features.topk_accuracy), predictions and the chosen weight decay."""
    probe = fit_linear(x_train, y_train, num_classes, weight_decays, seed=seed, max_iter=max_iter, on_step=on_step)
    ranked = rank_classes(probe.logits(np.asarray(x_test, np.float32)))
    top1, top5 = topk_accuracy(y_test, ranked, num_classes)
    return {
        "top1": top1,
        "top5": top5,
        "weight_decay": probe.weight_decay,
        "heldout_top1": probe.selection,
        "predictions": ranked[:, 0],
    }
