"""Flax NNX modules: ViT encoder, I-JEPA predictor, DiT, fixed position embeddings.

Modules never cross the Objective seam: ``to_pure`` turns a module into a nested dict of arrays
(string keys only, so that checkpoints and path-based sharding see plain names) and a
``ModuleTemplate`` rebuilds a module from such a dict (inside jit too). The modules import JAX, so
this package loads them on first use (PEP 562): the configurations (models/config.py) declare
options that the CLI reads before JAX loads.
"""

from __future__ import annotations

from jepa_cli.lazy import lazy_exports

_EXPORTS = {
    "MODEL_SIZES": "config", "ModelConfig": "config", "ModelSize": "config", "VideoModelConfig": "config",
    "ModuleTemplate": "template", "to_pure": "template", "VisionTransformer": "vit",
    "VisionTransformerPredictor": "vit", "param_count": "template", "first_non_finite": "template",
    "trunc_normal": "block",
    "sincos_1d_from_grid": "pos_embed", "sincos_2d": "pos_embed", "sincos_3d": "pos_embed",
}  # name -> the module that defines it

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
