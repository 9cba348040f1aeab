"""All of a sampler's random numbers from one `jax.random.bits` call.

Each call site of a JAX PRNG costs about half a second of XLA compilation on CPU, so a sampler draws
one flat block of 32-bit words and slices it; the words are independent and uniform.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def draw_bits(key: jax.Array, **shapes: tuple[int, ...]) -> dict[str, jax.Array]:
    """{name: uint32 array of that shape}, all from one draw."""
    sizes = {name: math.prod(shape) for name, shape in shapes.items()}
    flat = jax.random.bits(key, (max(1, sum(sizes.values())),), jnp.uint32)
    out, offset = {}, 0
    for name, shape in shapes.items():
        out[name] = flat[offset:offset + sizes[name]].reshape(shape)
        offset += sizes[name]
    return out


def uniform(bits: jax.Array) -> jax.Array:
    """uint32 words -> float32 uniform on [0, 1) (23 random mantissa bits)."""
    mantissa = (bits >> 9) | jnp.uint32(0x3F800000)
    return jax.lax.bitcast_convert_type(mantissa, jnp.float32) - 1.0
