"""Official (PyTorch) parameter names and layouts <-> this package's pure param dicts, for the three
official JEPA codebases this package's models reproduce.

One table (`MODULES`) lists, per family and part, each official module, ours, and its kind; the
kind fixes the leaves and their layouts (`_LEAVES`). The same table serves both directions:
`from_official` (import) and `to_official` (export) are inverses, so an exported run imports back
bit for bit.

- ``ijepa`` (facebookresearch/ijepa src/models/vision_transformer.py): ``patch_embed.proj`` (Conv2d
  weight [D, C, p, p]), ``blocks.{i}.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}`` (Linear
  weight [out, in]), ``norm``; the predictor's ``predictor_embed``, ``mask_token`` [1, 1, W],
  ``predictor_blocks.{i}``, ``predictor_norm``, ``predictor_proj``.
- ``vjepa`` (facebookresearch/jepa src/models/vision_transformer.py, predictor.py): the same names,
  ``patch_embed.proj`` a Conv3d [D, C, t, p, p] (utils/patch_embed.py PatchEmbed3D), and one
  ``mask_tokens.{k}`` [1, 1, W] per mask type (a ParameterList) for our ``mask_tokens`` [K, 1, W].
- ``audio-jepa`` (LudovicTuncay/Audio-JEPA src/models/components/vision_transformer.py): I-JEPA's
  names, but attention is flash_attn's MHA: ``attn.Wqkv`` and ``attn.out_proj`` for our
  ``attn.qkv`` and ``attn.proj`` (the same [3, heads, head_dim] split of the qkv features).

The fixed sin-cos tables (``pos_embed``, ``predictor_pos_embed``) are not parameters here
(models/pos_embed.py): they are skipped on the way in and left to the exporter on the way out.
Wrapper prefixes (``module.`` of DistributedDataParallel, ``backbone.`` of V-JEPA's
MultiMaskWrapper, ``_orig_mod.`` of torch.compile) are dropped on the way in.
"""

from __future__ import annotations

import re
from typing import Mapping

import numpy as np

from jepa_cli.errors import InputError

FAMILIES = ("ijepa", "vjepa", "audio-jepa")
FIXED_TABLES = ("pos_embed", "predictor_pos_embed")
WRAPPER_PREFIXES = ("module.", "backbone.", "_orig_mod.")


def _block(official: str, ours: str, qkv: str = "attn.qkv", proj: str = "attn.proj") -> tuple:
    """The rows of one transformer block `{i}` (official prefix, our prefix, the attention's names)."""
    return ((f"{official}norm1", f"{ours}norm1", "norm"), (f"{official}{qkv}", f"{ours}attn.qkv", "linear"),
            (f"{official}{proj}", f"{ours}attn.proj", "linear"), (f"{official}norm2", f"{ours}norm2", "norm"),
            (f"{official}mlp.fc1", f"{ours}mlp.fc1", "linear"), (f"{official}mlp.fc2", f"{ours}mlp.fc2", "linear"))


def _tables(token: tuple[str, str, str], **attn: str) -> dict[str, tuple]:
    return {
        "encoder": (("patch_embed.proj", "patch_embed", "conv"), *_block("blocks.{i}.", "blocks.{i}.", **attn),
                    ("norm", "norm", "norm")),
        "predictor": (("predictor_embed", "predictor_embed", "linear"), token,
                      *_block("predictor_blocks.{i}.", "blocks.{i}.", **attn),
                      ("predictor_norm", "norm", "norm"), ("predictor_proj", "proj", "linear")),
    }


# family -> part -> (official module, our module, kind); "{i}" a block index, "{k}" a mask type
MODULES: dict[str, dict[str, tuple[tuple[str, str, str], ...]]] = {
    "ijepa": _tables(("mask_token", "mask_token", "token")),
    "vjepa": _tables(("mask_tokens.{k}", "mask_tokens", "tokens")),
    "audio-jepa": _tables(("mask_token", "mask_token", "token"), qkv="attn.Wqkv", proj="attn.out_proj"),
}

# kind -> ((official leaf, our leaf, layout), ...); "" is the module itself (a bare parameter).
# Layouts: "T" Linear [out, in] <-> [in, out]; "conv" Conv [D, C, *k] <-> nnx.Conv [*k, C, D];
# "stack" one official [1, 1, W] per {k} <-> row k of ours [K, 1, W]; None as is.
_LEAVES = {
    "conv": (("weight", "kernel", "conv"), ("bias", "bias", None)),
    "linear": (("weight", "kernel", "T"), ("bias", "bias", None)),
    "norm": (("weight", "scale", None), ("bias", "bias", None)),
    "token": (("", "", None),),
    "tokens": (("", "", "stack"),),
}


def _pattern(template: str) -> re.Pattern:
    number = r"(?P<{}>[0-9]+)"  # ASCII digits only: \d would take any script's digits
    return re.compile(re.escape(template).replace(r"\{i\}", number.format("i")).replace(r"\{k\}", number.format("k"))
                      + "$")


def _join(module: str, leaf: str) -> str:
    return f"{module}.{leaf}" if leaf else module


def _rules(family: str, part: str) -> list[tuple[re.Pattern, str, re.Pattern, str, str | None]]:
    """(official regex, official template, our regex, our template, layout) per leaf."""
    if family not in MODULES:
        raise ValueError(f"unknown family {family!r} (known: {', '.join(FAMILIES)})")
    rules = []
    for official, ours, kind in MODULES[family][part]:
        for official_leaf, our_leaf, layout in _LEAVES[kind]:
            o, u = _join(official, official_leaf), _join(ours, our_leaf)
            rules.append((_pattern(o), o, _pattern(u), u, layout))
    return rules


def _to_ours(layout: str | None, value: np.ndarray) -> np.ndarray:
    if layout == "T":
        return np.transpose(value)
    if layout == "conv":
        return np.transpose(value, (*range(2, value.ndim), 1, 0))
    return value


def _to_official(layout: str | None, value: np.ndarray) -> np.ndarray:
    if layout == "T":
        return np.transpose(value)
    if layout == "conv":
        n = value.ndim
        return np.transpose(value, (n - 1, n - 2, *range(n - 2)))
    return value


def strip_wrappers(name: str) -> str:
    """`name` without leading wrapper prefixes (WRAPPER_PREFIXES, in any order and number)."""
    while True:
        for prefix in WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        else:
            return name


def _put(tree: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def from_official(state_dict: Mapping[str, np.ndarray], predictor: bool = False, family: str = "ijepa") -> dict:
    """A nested params dict (the encoder, or the predictor with ``predictor=True``) from an official
    state dict of `family` (wrapper prefixes dropped, the fixed sin-cos tables skipped). An unknown
    name, or mask tokens that are not numbered 0..K-1, raise InputError."""
    part = "predictor" if predictor else "encoder"
    rules = _rules(family, part)
    out: dict = {}
    stacks: dict[str, dict[int, np.ndarray]] = {}
    for name, value in state_dict.items():
        name = strip_wrappers(name)
        if name in FIXED_TABLES:
            continue
        for official, _, _, ours, layout in rules:
            match = official.match(name)
            if match:
                break
        else:
            raise InputError(f"unexpected {part} parameter {name!r} (not in the official {family} model)")
        value = np.asarray(value, np.float32)
        if layout == "stack":
            stacks.setdefault(ours, {})[int(match["k"])] = value.reshape(value.shape[-2:])
            continue
        _put(out, ours.replace("{i}", match.groupdict().get("i") or ""), _to_ours(layout, value))
    for ours, rows in stacks.items():
        if sorted(rows) != list(range(len(rows))):
            raise InputError(f"the {part}'s mask tokens are numbered {sorted(rows)}, not 0..{len(rows) - 1}")
        _put(out, ours, np.stack([rows[k] for k in range(len(rows))]))
    return out


def to_official(params: Mapping, predictor: bool = False, family: str = "ijepa") -> dict[str, np.ndarray]:
    """The official state dict of `family` (names without wrapper prefixes, C-contiguous arrays in
    the official layouts, without the fixed sin-cos tables) of a nested params dict: the encoder, or
    the predictor with ``predictor=True``. The inverse of `from_official`; InputError for a leaf the
    official model has no parameter for (another mixer than attention, for one)."""
    rules = _rules(family, "predictor" if predictor else "encoder")
    out: dict[str, np.ndarray] = {}

    def walk(node: Mapping, path: list[str]) -> None:
        for key, value in node.items():
            if isinstance(value, Mapping):
                walk(value, [*path, str(key)])
                continue
            name = ".".join([*path, str(key)])
            for _, official, ours, _, layout in rules:
                match = ours.match(name)
                if match:
                    break
            else:
                raise InputError(f"parameter {name} has no counterpart in the official model (only the "
                                 "attention ViT of the official code can be exported)")
            array = np.asarray(value)
            if layout == "stack":
                for k, row in enumerate(array):
                    out[official.replace("{k}", str(k))] = np.ascontiguousarray(row[None])
                continue
            out[official.replace("{i}", match.groupdict().get("i") or "")] = np.ascontiguousarray(
                _to_official(layout, array))

    walk(params, [])
    return out
