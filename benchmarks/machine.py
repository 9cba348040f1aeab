"""The machine's own matmul rate, measured in the same run as each benchmark (the utilisation baseline)."""

from __future__ import annotations

import time


def matmul_flops(n: int = 2048, repeats: int = 10) -> float:
    """Best sustained float32 matmul FLOP/s of the default JAX device (an XLA dot of two n x n)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(2), (n, n), jnp.float32)
    product = jax.jit(lambda x, y: x @ y)
    product(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        product(a, b).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 / best
