"""The MaskSet pytree: a batch of masks in index form (docs/architecture.md, "Masks")."""

from __future__ import annotations

from dataclasses import dataclass

import jax


@jax.tree_util.register_dataclass
@dataclass
class MaskSet:
    """A batch of masks in index form with static shapes (docs/architecture.md, "Masks").

    context_index int32 [B, C, K], context_valid bool [B, C, K], target_index int32 [B, M, T],
    target_valid bool [B, M, T]. Indices are raster order (frame-major in 3D); valid slots come first
    in ascending index order; padded slots hold index 0 and are False in the validity mask.
    """

    context_index: jax.Array
    context_valid: jax.Array
    target_index: jax.Array
    target_valid: jax.Array
