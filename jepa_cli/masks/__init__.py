"""Pure-JAX mask samplers (multiblock, multiblock3d, random) and the mask file format.

See docs/masks.md for the design and docs/architecture.md for the MaskSet contract. The samplers
import JAX, so this package loads its modules on first use (PEP 562): the strategy configs
(masks/config.py) declare options that the CLI reads before JAX loads.
"""

from __future__ import annotations

from jepa_cli.lazy import lazy_exports

_EXPORTS = {
    "MaskConfig": "config", "MultiBlockConfig": "config", "MultiBlock3DConfig": "config", "RandomConfig": "config",
    "check_batch": "checks", "config_from_options": "parse", "config_parameters": "config",
    "context_slots": "sampler", "target_slots": "sizes", "validate": "checks", "validate_token_grid": "checks",
    "MaskSet": "maskset",
    "to_dense": "indexing", "sample": "sampler", "sample_many": "sampler",
}  # name -> the module that defines it

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
