"""Audio-JEPA `random_block` masks in JAX (LudovicTuncay/Audio-JEPA src/models/jepa_module.py).

A masking ratio ~ U(lo, hi) per batch; per sample a uniform random permutation of all patches, the
first int(N * (1 - ratio)) are the context and the rest the one target set.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jepa_cli.masks.config import RandomConfig
from jepa_cli.masks.sizes import target_slots
from jepa_cli.masks.indexing import dense_to_index
from jepa_cli.masks.maskset import MaskSet
from jepa_cli.masks.rng import draw_bits, uniform


def sample_random(key: jax.Array, config: RandomConfig, batch_size: int, context_k: int) -> MaskSet:
    """A batch of random masks; each context holds at most `context_k` slots (sampler.context_slots)."""
    n = config.num_patches
    bits = draw_bits(key, ratio=(1,), perm=(batch_size, n), select=(batch_size, 1, n))
    lo, hi = config.ratio
    ratio = lo + uniform(bits["ratio"])[0] * (hi - lo)
    keep = jnp.floor(n * (1 - ratio)).astype(jnp.int32)
    # rank of every patch in a uniform permutation: argsort of iid words (ties broken by index)
    rank = jnp.argsort(jnp.argsort(bits["perm"], axis=-1), axis=-1)
    context = (rank < keep)[:, None, :]
    # every context of the batch has `keep` patches: the official collator's cut to the minimum is a no-op
    c_index, c_valid = dense_to_index(bits["select"], context, context_k, False)
    t_index, t_valid = dense_to_index(None, ~context, target_slots(config), False)
    return MaskSet(c_index, c_valid, t_index, t_valid)
