"""Official I-JEPA (PyTorch) parameter names and layouts -> this package's pure param dicts.

The official src/models/vision_transformer.py names: ``patch_embed.proj`` (Conv2d weight
[D, C, p, p]), ``blocks.{i}.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}`` (Linear weight
[out, in]), ``norm``; the predictor's ``predictor_embed``, ``mask_token``,
``predictor_blocks.{i}``, ``predictor_norm``, ``predictor_proj``. The fixed sin-cos tables
(``pos_embed``, ``predictor_pos_embed``) are not parameters here (models/pos_embed.py) and are
skipped.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from jepa_cli.errors import InputError

# official module prefix -> ours, for the predictor (the encoder's names are ours already)
_PREDICTOR_RENAMES = (("predictor_blocks.", "blocks."), ("predictor_embed", "predictor_embed"),
                      ("predictor_norm", "norm"), ("predictor_proj", "proj"))
FIXED_TABLES = ("pos_embed", "predictor_pos_embed")


def _leaf(name: str, value: np.ndarray) -> tuple[list[str], np.ndarray]:
    """One official tensor -> (our path, our array)."""
    parts = name.split(".")
    last = parts[-1]
    if last == "mask_token":
        return parts, value
    if parts[:2] == ["patch_embed", "proj"]:
        parts = ["patch_embed"]
        if last == "weight":  # Conv2d [D, C, p, p] -> nnx.Conv [p, p, C, D]
            return parts + ["kernel"], np.transpose(value, (2, 3, 1, 0))
        return parts + ["bias"], value
    owner = parts[:-1]
    if last == "bias":
        return owner + ["bias"], value
    if value.ndim == 1:  # LayerNorm weight
        return owner + ["scale"], value
    return owner + ["kernel"], np.transpose(value)  # Linear [out, in] -> [in, out]


def from_official(state_dict: Mapping[str, np.ndarray], predictor: bool = False) -> dict:
    """A nested params dict (encoder, or predictor with ``predictor=True``) from an official
    state dict (names without the ``module.`` prefix of DistributedDataParallel, which is
    stripped here). Unknown names raise InputError."""
    out: dict = {}
    for name, value in state_dict.items():
        name = name.removeprefix("module.")
        if name in FIXED_TABLES:
            continue
        if predictor:
            for old, new in _PREDICTOR_RENAMES:
                if name.startswith(old):
                    name = new + name[len(old):]
                    break
            else:
                if name != "mask_token":
                    raise InputError(f"unexpected predictor parameter {name!r}")
        path, array = _leaf(name, np.asarray(value, np.float32))
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = array
    return out
