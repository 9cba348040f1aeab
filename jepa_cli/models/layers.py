"""The layers every model here is built from, as the official PyTorch code initialises and computes
them: trunc-normal(0.02) Linear weights and zero biases (PyTorch's ``trunc_normal_``), LayerNorm in
float32 (eps 1e-6 unless given), exact-erf GELU. Parameters are float32; ``dtype`` is the compute
dtype of a Linear."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def trunc_normal(std: float = 0.02):
    """PyTorch ``trunc_normal_(std=std)`` (bounds +-2 absolute): for std 0.02 a plain normal."""

    def init(key, shape, dtype=jnp.float32):
        x = jax.random.truncated_normal(key, -2.0 / std, 2.0 / std, shape, jnp.float32)
        return (x * std).astype(dtype)

    return init


zero_init = nnx.initializers.zeros_init()


class Linear(nnx.Linear):
    """nnx.Linear applied to a 2-D view of the tokens [..., din] -> [..., dout].

    Same parameters and maths; XLA:CPU computes the weight gradient of a 2-D dot about twice as
    fast as that of a dot contracting several leading axes (benchmarks/train_step.py).
    """

    def __call__(self, x):
        lead = x.shape[:-1]
        y = super().__call__(x.reshape(-1, x.shape[-1]))
        return y.reshape(*lead, y.shape[-1])


def linear_layer(din, dout, dtype, rngs):
    return Linear(
        din, dout, kernel_init=trunc_normal(), bias_init=zero_init,
        dtype=dtype, param_dtype=jnp.float32, rngs=rngs,
    )


NORM_EPS = 1e-6  # I-JEPA / V-JEPA vit_*: partial(nn.LayerNorm, eps=1e-6)


def layer_norm(dim, dtype, rngs, eps: float = NORM_EPS):
    """LayerNorm in float32 whatever the compute dtype: torch autocast runs layer_norm in float32."""
    del dtype
    return nnx.LayerNorm(dim, epsilon=eps, dtype=jnp.float32, param_dtype=jnp.float32, rngs=rngs)


@jax.custom_vjp
def gelu(x):
    """Exact (erf) GELU, as torch.nn.GELU in the official code: x * Phi(x).

    Same values as jax.nn.gelu(approximate=False); the custom backward reuses Phi(x) from the
    forward pass, where autodiff of erf made XLA:CPU recompute it (the MLP backward ran 2.3x slower).
    """
    return x * _normal_cdf(x)


def _normal_cdf(x):
    return 0.5 * (1.0 + jax.lax.erf(x * np.asarray(1.0 / np.sqrt(2.0), x.dtype)))


def _gelu_forward(x):
    cdf = _normal_cdf(x)
    return x * cdf, (x, cdf)


def _gelu_backward(residuals, grad):
    x, cdf = residuals
    density = jnp.exp(-0.5 * x * x) * np.asarray(1.0 / np.sqrt(2.0 * np.pi), x.dtype)  # phi(x)
    return (grad * (cdf + x * density),)


gelu.defvjp(_gelu_forward, _gelu_backward)
