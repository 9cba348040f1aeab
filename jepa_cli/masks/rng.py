"""All of a sampler's random numbers from one `jax.random.bits` call.

Each call site of a JAX PRNG costs about half a second of XLA compilation on CPU, and threefry's
20 rounds per word dominate a small sampler's run time there, so a sampler draws one flat block of
threefry words: small arrays directly, and for a large array one seed word per row (per sample),
expanded along the row by a counter-based integer hash (lowbias32, a full-avalanche 32-bit mixer).
The words are deterministic for a given key and statistically uniform and independent for this use.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

DIRECT_MAX = 64  # arrays up to this many words come straight from threefry


def hash32(x: jax.Array) -> jax.Array:
    """lowbias32 (C. Wellons): a bijective 32-bit integer hash with full avalanche."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def expand(seeds: jax.Array, count: int) -> jax.Array:
    """uint32 seeds [R] -> [R, count] words: hash(hash(counter) ^ seed), hashed twice more."""
    counter = hash32(jnp.arange(count, dtype=jnp.uint32) + jnp.uint32(0x9E3779B9))
    return hash32(hash32(counter[None, :] ^ seeds[:, None]) + seeds[:, None])


def draw_bits(key: jax.Array, **shapes: tuple[int, ...]) -> dict[str, jax.Array]:
    """{name: uint32 array of that shape}, all from one threefry draw."""
    plan = {}
    total = 0
    for name, shape in shapes.items():
        size = math.prod(shape)
        direct = size <= DIRECT_MAX or len(shape) < 2
        n = size if direct else shape[0]
        plan[name] = (total, n, direct)
        total += n
    flat = jax.random.bits(key, (max(1, total),), jnp.uint32)
    out = {}
    for name, shape in shapes.items():
        offset, n, direct = plan[name]
        words = flat[offset:offset + n]
        out[name] = words.reshape(shape) if direct else expand(words, math.prod(shape[1:])).reshape(shape)
    return out


def uniform(bits: jax.Array) -> jax.Array:
    """uint32 words -> float32 uniform on [0, 1) (23 random mantissa bits)."""
    mantissa = (bits >> 9) | jnp.uint32(0x3F800000)
    return jax.lax.bitcast_convert_type(mantissa, jnp.float32) - 1.0
