"""Audio-JEPA `random_block` masks in JAX (LudovicTuncay/Audio-JEPA src/models/jepa_module.py).

A masking ratio ~ U(lo, hi) per batch; per sample a uniform random permutation of all patches, the
first int(N * (1 - ratio)) are the context and the rest the one target set.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jepa_cli.masks.config import MaskSet, RandomConfig, context_slots, target_slots
from jepa_cli.masks.indexing import dense_to_index


def sample_random(key: jax.Array, config: RandomConfig, batch_size: int) -> MaskSet:
    n = config.num_patches
    k_ratio, k_perm, k_select = jax.random.split(key, 3)
    lo, hi = config.ratio
    ratio = lo + jax.random.uniform(k_ratio) * (hi - lo)
    keep = jnp.floor(n * (1 - ratio)).astype(jnp.int32)
    # rank of every patch in a uniform permutation: argsort of iid uniforms
    rank = jnp.argsort(jnp.argsort(jax.random.uniform(k_perm, (batch_size, n)), axis=-1), axis=-1)
    context = (rank < keep)[:, None, :]
    c_index, c_valid = dense_to_index(k_select, context, context_slots(config), config.official_truncation)
    t_index, t_valid = dense_to_index(None, ~context, target_slots(config), config.official_truncation)
    return MaskSet(c_index, c_valid, t_index, t_valid)
