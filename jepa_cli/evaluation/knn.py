"""k-NN probe: cosine similarity, k nearest TRAIN rows, temperature-weighted or majority votes.

The weighted vote is DINO's eval_knn.py: each of the k neighbours votes for its class with weight
exp(similarity / T) (T = 0.07), classes are ranked by total vote; top-1 is the best class and top-5
whether the label is among the best min(5, k). The majority vote weights every neighbour 1.
Ties go to the lower class index. Test rows are processed in fixed-size batches with
`jax.lax.top_k`, so memory is `batch x N_train` similarities however large TEST is.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jepa_cli.evaluation.features import topk_accuracy

SIMILARITY_BUDGET = 1 << 25  # floats of the [batch, N_train] similarity block (128 MiB)


def l2_normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norm, 1e-12)


@partial(jax.jit, static_argnames=("k", "num_classes", "majority"))
def _knn_batch(test, train, train_labels, k: int, num_classes: int, temperature, majority: bool):
    sims = test @ train.T                                   # [B, N]
    top_sims, top_idx = jax.lax.top_k(sims, k)              # [B, k], ties: lower index first
    neighbour_labels = train_labels[top_idx]                # [B, k]
    weights = jnp.ones_like(top_sims) if majority else jnp.exp(top_sims / temperature)
    votes = jnp.einsum("bk,bkc->bc", weights, jax.nn.one_hot(neighbour_labels, num_classes, dtype=weights.dtype))
    _, ranked = jax.lax.top_k(votes, min(5, k, num_classes))  # ties: lower class index first
    return ranked


def knn_rank(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, num_classes: int, k: int = 20,
             temperature: float = 0.07, vote: str = "weighted", batch_size: int | None = None,
             on_batch: Callable[[int], None] | None = None) -> np.ndarray:
    """Ranked class predictions `[N_test, min(5, k, C)]` for each test row."""
    if vote not in ("weighted", "majority"):
        raise ValueError(f"vote must be 'weighted' or 'majority', got {vote!r}")
    if k > len(x_train):
        raise ValueError(f"k={k} exceeds the {len(x_train)} training samples")
    train = jnp.asarray(l2_normalise(x_train))
    labels = jnp.asarray(np.asarray(y_train, np.int32))
    test = l2_normalise(x_test)
    n = len(test)
    if batch_size is None:
        batch_size = max(1, min(n, SIMILARITY_BUDGET // max(1, len(x_train))))
    out = []
    for start in range(0, n, batch_size):
        block = test[start:start + batch_size]
        real = len(block)
        if real < batch_size:  # pad to one static shape: one compilation
            block = np.concatenate([block, np.zeros((batch_size - real, block.shape[1]), np.float32)])
        ranked = _knn_batch(jnp.asarray(block), train, labels, k, num_classes,
                            jnp.float32(temperature), vote == "majority")
        out.append(np.asarray(ranked)[:real])
        if on_batch:
            on_batch(real)
    return np.concatenate(out, axis=0)


def knn_probe(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, num_classes: int,
              k: int = 20, temperature: float = 0.07, vote: str = "weighted", batch_size: int | None = None,
              on_batch: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Top-1/top-5 (fractions; top-5 None for 5 classes or fewer, features.topk_accuracy) of the k-NN
    classifier and its top-1 predictions. A `k` above the number of training rows is lowered to it
    (every training row votes); the result's "k" is the one used, so that a caller can say so."""
    k = min(k, len(x_train))
    ranked = knn_rank(x_train, y_train, x_test, num_classes, k, temperature, vote, batch_size, on_batch)
    top1, top5 = topk_accuracy(y_test, ranked, num_classes)
    return {"top1": top1, "top5": top5,
            "k": k, "temperature": temperature, "vote": vote, "predictions": ranked[:, 0]}
