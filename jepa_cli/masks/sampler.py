"""`sample(key, config, batch_size) -> MaskSet`: dispatch on the config's type (jit-able), and the
context slot count K a config's samples hold (derived by drawing masks when not set)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np

from jepa_cli.masks.checks import validate
from jepa_cli.masks.config import MaskConfig, MultiBlock3DConfig, MultiBlockConfig, RandomConfig
from jepa_cli.masks.maskset import MaskSet
from jepa_cli.masks.multiblock import sample_multiblock
from jepa_cli.masks.multiblock3d import sample_multiblock3d
from jepa_cli.masks.random import sample_random
from jepa_cli.masks.sizes import max_context_count


@functools.partial(jax.jit, static_argnums=(1, 2))
def sample(key: jax.Array, config: MaskConfig, batch_size: int) -> MaskSet:
    """A batch of masks for `config`; shapes depend only on (config, batch_size); same key, same masks.

    The config is validated when traced (InputError for one that cannot be sampled)."""
    validate(config)
    if isinstance(config, MultiBlockConfig):
        return sample_multiblock(key, config, batch_size, context_slots(config, batch_size))
    if isinstance(config, MultiBlock3DConfig):
        return sample_multiblock3d(key, config, batch_size, context_slots(config, batch_size))
    if isinstance(config, RandomConfig):
        return sample_random(key, config, batch_size, context_slots(config))
    raise TypeError(f"not a mask config: {type(config).__name__}")


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def sample_many(key: jax.Array, config: MaskConfig, batch_size: int, batches: int) -> MaskSet:
    """`batches` independent batches (each with its own block sizes), stacked: every field [G, B, ...]."""
    return jax.vmap(lambda k: sample(k, config, batch_size))(jax.random.split(key, batches))


DERIVE_BATCHES, DERIVE_BATCH_SIZE, DERIVE_QUANTILE = 32, 128, 90


@functools.lru_cache(maxsize=None)
def context_slots(config: MaskConfig, batch_size: int | None = None) -> int:
    """K: `context_size`, or the derived default (docs/masks.md).

    Default mode: K is the 90th percentile of the official collator's batch-minimum context count at
    batch 128, estimated from 32 batches drawn with this config and PRNGKey(0), so that at least 9
    batches in 10 keep as many tokens per sample as the official cut would.
    Official truncation: K is the largest batch minimum seen over those probe batches drawn at the
    actual `batch_size`, so the static shapes cost about the official work and the cut fits K in
    all but rare batches (which then keep their K lowest indices).
    """
    if config.context_size is not None:
        return int(config.context_size)
    upper = max_context_count(config)
    if isinstance(config, RandomConfig):
        return upper  # every context of a batch has the same length: nothing to cut
    probe_batch = DERIVE_BATCH_SIZE
    if config.official_truncation and batch_size:  # the cut runs over one group: probe at its size
        probe_batch = min(batch_size, config.collator_batch or batch_size)
    probe = dataclasses.replace(config, context_size=upper, official_truncation=True, collator_batch=None)
    # One compiled program, run at once: concrete even when K is asked for while a training step is
    # being traced. (Under jax.ensure_compile_time_eval a jitted function runs op by op: about 70
    # one-operation compiles for a tiny model.)
    draw = jax.jit(lambda: sample_many(jax.random.PRNGKey(0), probe, probe_batch, DERIVE_BATCHES).context_valid)
    valid = draw.lower().compile()()
    # official cut per batch and context (pair); K must serve the largest pair
    mins = np.asarray(valid).sum(-1).min(axis=1).max(axis=-1)
    quantile = 100 if config.official_truncation else DERIVE_QUANTILE
    return max(1, int(np.percentile(mins, quantile, method="higher")))

