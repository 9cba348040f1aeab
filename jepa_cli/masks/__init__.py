"""Pure-JAX mask samplers (multiblock, multiblock3d, random) and the mask file format.

See docs/masks.md for the design and docs/architecture.md for the MaskSet contract.
"""

from jepa_cli.masks.config import (MaskConfig, MaskSet, MultiBlock3DConfig, MultiBlockConfig, RandomConfig,
                                   check_batch, config_from_options, config_parameters, context_slots, target_slots,
                                   validate)
from jepa_cli.masks.indexing import to_dense
from jepa_cli.masks.sampler import sample, sample_many

__all__ = [
    "MaskConfig", "MaskSet", "MultiBlockConfig", "MultiBlock3DConfig", "RandomConfig", "check_batch",
    "config_from_options", "config_parameters", "context_slots", "target_slots", "validate", "to_dense", "sample", "sample_many",
]
