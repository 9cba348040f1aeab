"""`sample(key, config, batch_size) -> MaskSet`: dispatch on the config's type (jit-able)."""

from __future__ import annotations

import functools

import jax

from jepa_cli.masks.config import MaskConfig, MultiBlock3DConfig, MultiBlockConfig, RandomConfig
from jepa_cli.masks.maskset import MaskSet


@functools.partial(jax.jit, static_argnums=(1, 2))
def sample(key: jax.Array, config: MaskConfig, batch_size: int) -> MaskSet:
    """A batch of masks for `config`; shapes depend only on (config, batch_size); same key, same masks.

    The config is validated when traced (InputError for one that cannot be sampled)."""
    from jepa_cli.masks.checks import validate

    validate(config)
    if isinstance(config, MultiBlockConfig):
        from jepa_cli.masks.multiblock import sample_multiblock

        return sample_multiblock(key, config, batch_size)
    if isinstance(config, MultiBlock3DConfig):
        from jepa_cli.masks.multiblock3d import sample_multiblock3d

        return sample_multiblock3d(key, config, batch_size)
    if isinstance(config, RandomConfig):
        from jepa_cli.masks.random import sample_random

        return sample_random(key, config, batch_size)
    raise TypeError(f"not a mask config: {type(config).__name__}")


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def sample_many(key: jax.Array, config: MaskConfig, batch_size: int, batches: int) -> MaskSet:
    """`batches` independent batches (each with its own block sizes), stacked: every field [G, B, ...]."""
    return jax.vmap(lambda k: sample(k, config, batch_size))(jax.random.split(key, batches))
