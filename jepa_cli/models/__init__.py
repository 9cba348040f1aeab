"""Flax NNX modules: ViT encoder, I-JEPA predictor, fixed position embeddings.

Modules never cross the Objective seam: ``to_pure`` turns a module into a nested dict of arrays
(string keys only, so that checkpoints and path-based sharding see plain names) and a
``ModuleTemplate`` rebuilds a module from such a dict (inside jit too).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
from flax import nnx

from jepa_cli.models.pos_embed import sincos_1d_from_grid, sincos_2d, sincos_3d
from jepa_cli.models.vit import (
    MODEL_SIZES,
    ModelConfig,
    ModelSize,
    VisionTransformer,
    VisionTransformerPredictor,
    param_count,
    trunc_normal,
)

__all__ = [
    "MODEL_SIZES", "ModelConfig", "ModelSize", "ModuleTemplate", "VisionTransformer",
    "VisionTransformerPredictor", "param_count", "sincos_1d_from_grid", "sincos_2d",
    "sincos_3d", "to_pure", "trunc_normal",
]


def _str_keys(tree):
    if isinstance(tree, dict):
        return {str(k): _str_keys(v) for k, v in tree.items()}
    return tree


def to_pure(module: nnx.Module) -> dict:
    """The module's parameters as a nested dict of arrays with string keys."""
    return _str_keys(nnx.split(module)[1].to_pure_dict())


class ModuleTemplate:
    """Builds a module's structure once (abstractly, no allocation) and merges pure dicts into it."""

    def __init__(self, build: Callable[[nnx.Rngs], nnx.Module]):
        self._build = build
        self.graphdef, self.abstract_state = nnx.split(nnx.eval_shape(lambda: build(nnx.Rngs(0))))

    def init(self, key) -> dict:
        return to_pure(self._build(nnx.Rngs(params=key)))

    def shapes(self) -> dict:
        """Parameter shapes/dtypes (jax.ShapeDtypeStruct) as a nested dict, no allocation."""
        return _str_keys(self.abstract_state.to_pure_dict())

    def merge(self, params: dict) -> Any:
        state = jax.tree.map(lambda v: v, self.abstract_state)
        nnx.replace_by_pure_dict(state, params)
        return nnx.merge(self.graphdef, state)
