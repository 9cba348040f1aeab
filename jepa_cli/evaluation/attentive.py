"""Attentive probe: V-JEPA's frozen-evaluation classifier over token features `[N, T, D]`.

As in V-JEPA (src/models/attentive_pooler.py, AttentiveClassifier): one learned query token, one
cross-attention block (pre-norm LayerNorm eps 1e-6, multi-head cross-attention from the query to
the tokens, residual, MLP with ratio 4 and exact GELU, residual), then a linear head on the pooled
query. Weights are truncated-normal (std 0.02) with zero biases, and the block's output projections
are rescaled by 1/sqrt(2) (V-JEPA's `_rescale_blocks` for layer 1). Training: AdamW, lr 1e-3 with a
cosine decay to 0 over all steps, weight decay 0.01 on matrices (not biases or norms), shuffled
minibatches, cross-entropy; `epochs` defaults to 20 (the official recipe).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jepa_cli.evaluation.features import topk_accuracy

EPOCHS = 20
BATCH_SIZE = 256
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 0.01


def default_heads(dim: int) -> int:
    """Heads of 64 channels when the width allows it (ViT-tiny 3, ViT-small 6), else one head."""
    return dim // 64 if dim % 64 == 0 else 1


_init = nnx.initializers.truncated_normal(stddev=0.02)


def _linear(din: int, dout: int, rngs: nnx.Rngs, scale: float = 1.0) -> nnx.Linear:
    layer = nnx.Linear(din, dout, kernel_init=_init, bias_init=nnx.initializers.zeros_init(), rngs=rngs)
    if scale != 1.0:
        layer.kernel[...] = layer.kernel[...] * scale
    return layer


class CrossAttentionBlock(nnx.Module):
    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, *, rngs: nnx.Rngs):
        if dim % num_heads:
            raise ValueError(f"width {dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        rescale = 1.0 / math.sqrt(2.0)
        self.norm1 = nnx.LayerNorm(dim, epsilon=1e-6, rngs=rngs)
        self.q = _linear(dim, dim, rngs)
        self.kv = _linear(dim, 2 * dim, rngs)
        self.proj = _linear(dim, dim, rngs, rescale)
        self.norm2 = nnx.LayerNorm(dim, epsilon=1e-6, rngs=rngs)
        hidden = int(dim * mlp_ratio)
        self.fc1 = _linear(dim, hidden, rngs)
        self.fc2 = _linear(hidden, dim, rngs, rescale)

    def __call__(self, q: jax.Array, x: jax.Array) -> jax.Array:
        b, nq, d = q.shape
        t = x.shape[1]
        h = self.num_heads
        xn = self.norm1(x)
        qh = self.q(q).reshape(b, nq, h, d // h)
        kv = self.kv(xn).reshape(b, t, 2, h, d // h)
        y = jax.nn.dot_product_attention(qh, kv[:, :, 0], kv[:, :, 1])  # [B, Q, H, D/H]
        q = q + self.proj(y.reshape(b, nq, d))
        q = q + self.fc2(jax.nn.gelu(self.fc1(self.norm2(q)), approximate=False))
        return q


class AttentiveClassifier(nnx.Module):
    """One learned query, one cross-attention block, a linear head: `[B, T, D] -> [B, C]` logits."""

    def __init__(self, dim: int, num_classes: int, num_heads: int | None = None, *, rngs: nnx.Rngs):
        self.query = nnx.Param(_init(rngs.params(), (1, 1, dim), jnp.float32))
        self.block = CrossAttentionBlock(dim, num_heads or default_heads(dim), rngs=rngs)
        self.head = _linear(dim, num_classes, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        q = jnp.broadcast_to(self.query[...], (x.shape[0], 1, x.shape[-1]))
        return self.head(self.block(q, x)[:, 0])


def _decay_mask(params):
    return jax.tree.map(lambda p: p.ndim > 1, params)


def _make_step(graphdef, tx):
    """A jitted pure update on (params, opt_state): the NNX module is split once, outside."""

    @jax.jit
    def step(params, opt_state, x, y):
        def loss_fn(p):
            logits = nnx.merge(graphdef, p)(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


@nnx.jit
def _logits(model: AttentiveClassifier, x):
    return model(x)


def fit_attentive(x: np.ndarray, y: np.ndarray, num_classes: int, epochs: int = EPOCHS,
                  batch_size: int = BATCH_SIZE, learning_rate: float = LEARNING_RATE,
                  weight_decay: float = WEIGHT_DECAY, num_heads: int | None = None, seed: int = 0,
                  on_epoch: Callable[[int, float], None] | None = None) -> AttentiveClassifier:
    """Trains the classifier on tokens `x` [N, T, D] and labels `y` [N]."""
    x = np.asarray(x, np.float32)
    y = np.asarray(y, np.int32)
    n = len(x)
    batch_size = min(batch_size, n)
    steps_per_epoch = n // batch_size  # the remainder rows are dropped this epoch (reshuffled next)
    total = max(1, epochs * steps_per_epoch)
    model = AttentiveClassifier(x.shape[-1], num_classes, num_heads, rngs=nnx.Rngs(seed))
    tx = optax.adamw(optax.cosine_decay_schedule(learning_rate, total), weight_decay=weight_decay,
                     mask=_decay_mask)
    graphdef, params = nnx.split(model, nnx.Param)
    opt_state = tx.init(params)
    step = _make_step(graphdef, tx)
    rng = np.random.default_rng(seed)
    for epoch in range(epochs):
        perm = rng.permutation(n)
        losses = []
        for s in range(steps_per_epoch):
            idx = perm[s * batch_size:(s + 1) * batch_size]
            params, opt_state, loss = step(params, opt_state, jnp.asarray(x[idx]), jnp.asarray(y[idx]))
            losses.append(loss)
        if on_epoch:
            on_epoch(epoch + 1, float(np.mean([float(v) for v in losses])) if losses else float("nan"))
    nnx.update(model, params)
    return model


def predict_logits(model: AttentiveClassifier, x: np.ndarray, batch_size: int = BATCH_SIZE) -> np.ndarray:
    x = np.asarray(x, np.float32)
    out = []
    for start in range(0, len(x), batch_size):
        block = x[start:start + batch_size]
        real = len(block)
        if real < batch_size and len(x) > batch_size:  # pad to the static shape: one compilation
            block = np.concatenate([block, np.zeros((batch_size - real,) + block.shape[1:], np.float32)])
        out.append(np.asarray(_logits(model, jnp.asarray(block)))[:real])
    return np.concatenate(out, axis=0)


def attentive_probe(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
                    num_classes: int, epochs: int = EPOCHS, batch_size: int = BATCH_SIZE, seed: int = 0,
                    num_heads: int | None = None,
                    on_epoch: Callable[[int, float], None] | None = None) -> dict[str, Any]:
    """Trains on TRAIN tokens, scores TEST: top-1/top-5 (fractions; top-5 None for 5 classes or
    fewer, features.topk_accuracy) and predictions."""
    from jepa_cli.evaluation.linear import rank_classes

    model = fit_attentive(x_train, y_train, num_classes, epochs, batch_size, seed=seed, num_heads=num_heads,
                          on_epoch=on_epoch)
    ranked = rank_classes(predict_logits(model, x_test, batch_size))
    top1, top5 = topk_accuracy(y_test, ranked, num_classes)
    return {"top1": top1, "top5": top5, "epochs": epochs,
            "tokens": int(np.asarray(x_train).shape[1]), "predictions": ranked[:, 0]}
