"""The model of a published JEPA checkpoint, told by its tensors' shapes (V-JEPA and Audio-JEPA) or
given (I-JEPA), and the checks that the chosen model's parameters and position tables are the file's."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import jax
import numpy as np

from jepa_cli.errors import InputError

# (width, depth) -> (our size name, heads) of the released encoders
VJEPA_RELEASES = {(1024, 24): ("large", 16), (1280, 32): ("huge", 16)}  # vit_large, vit_huge
VJEPA_FRAMES, VJEPA_TUBELET, VJEPA_PATCH = 16, 2, 16  # data.num_frames, tubelet_size, patch_size
VJEPA_IMAGE_SIZES = (224, 384)  # vitl16 / vith16 crop_size 224, vith16_384 crop_size 384
AUDIO_RELEASES = {(768, 12): ("base", 12)}  # configs/model/jepa.yaml encoder 768 / 12 / 12
AUDIO_MEL_BINS = 128  # Audio-JEPA: 128 mel bins


def tensor_shape(part: Mapping[str, Any], name: str, source: Path, what: str,
                 ndim: int | None = None) -> tuple[int, ...]:
    """The shape of tensor `name` of the state dict `part` (the `what` of `source`, for messages);
    InputError when it is missing or not `ndim`-D."""
    value = part.get(name)
    if value is None:
        raise InputError(f"{source}: the {what} has no {name}")
    shape = tuple(int(n) for n in value.shape)
    if ndim is not None and len(shape) != ndim:
        raise InputError(f"{source}: the {what}'s {name} is {list(shape)}, not {ndim}-D")
    return shape


def _depth(part: Mapping[str, Any], prefix: str, source: Path, what: str) -> int:
    """How many blocks `prefix{i}.` the state dict numbers: InputError, naming the key, unless they are
    numbered 0..n-1 in ASCII digits (a stray `blocks.999999999.` would build a billion-block model)."""
    found: dict[int, str] = {}
    for name in part:
        if name.startswith(prefix):
            number = name[len(prefix):].split(".")[0]
            if not (number.isascii() and number.isdigit() and str(int(number)) == number):
                raise InputError(f"{source}: the {what}'s {name} is not numbered like a block "
                                 f"({prefix}0., {prefix}1., ...)")
            found.setdefault(int(number), name)
    n = len(found)
    if n and max(found) != n - 1:
        missing = next(i for i in range(n) if i not in found)
        raise InputError(f"{source}: the {what} has {found[max(found)]} but no {prefix}{missing}. (block numbers "
                         "run from 0 without a gap)")
    return n


def _heads(releases: dict, width: int, depth: int, given: dict, title: str, source: Path) -> dict[str, Any]:
    """The size fields of a released (width, depth), or of another one whose heads are given."""
    if (width, depth) in releases and given.get("heads") in (None, releases[(width, depth)][1]):
        name, heads = releases[(width, depth)]
        return {"model": name, "width": None, "depth": None, "heads": None}
    if given.get("heads") is None:
        known = ", ".join(f"{d} blocks of width {w}" for w, d in releases)
        raise InputError(f"{source}: an encoder of {depth} blocks of width {width} is not a released {title} size "
                         f"({known}); give --heads (and --pred-heads) to import it as another size")
    return {"model": "tiny", "width": width, "depth": depth, "heads": given["heads"]}


def encoder_part(parts: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    """The context encoder's state dict, or the one encoder of a one-encoder file."""
    return parts["encoder"] if "encoder" in parts else parts["target_encoder"]


def _predictor_fields(pred: Mapping[str, Any] | None, source: Path, given: Mapping[str, Any]) -> dict[str, Any]:
    """pred_width and pred_depth from the predictor's shapes (None: a one-encoder file, whose
    predictor is the given one or the objective's default), pred_heads as given."""
    if pred is None:
        return {k: given.get(k) for k in ("pred_width", "pred_depth", "pred_heads")}
    return {"pred_width": tensor_shape(pred, "predictor_embed.weight", source, "predictor", 2)[0],
            "pred_depth": _depth(pred, "predictor_blocks.", source, "predictor"), "pred_heads": given.get("pred_heads")}


def infer_vjepa_config(parts: Mapping[str, Mapping[str, Any]], source: Path,
                       given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The VJEPAConfig model fields of a V-JEPA checkpoint, from its shapes alone: width, channels,
    tubelet and patch from the Conv3d weight [D, C, t, p, p]; depth and predictor depth from the
    block numbers; the predictor width from predictor_embed [W, D]; the grid from pos_embed [1, N, D]
    with `num_frames` (16, as every release, unless given) and a square crop. `given` (heads,
    pred_heads, num_frames, image_size) completes what shapes cannot tell."""
    given = {k: v for k, v in (given or {}).items() if v is not None}
    enc, pred = encoder_part(parts), parts.get("predictor")
    width, channels, tubelet, patch, patch_w = tensor_shape(enc, "patch_embed.proj.weight", source, "encoder", 5)
    if patch != patch_w:
        raise InputError(f"{source}: patches of {patch}x{patch_w} pixels; the ViT here takes square patches")
    depth = _depth(enc, "blocks.", source, "encoder")
    fields = _heads(VJEPA_RELEASES, width, depth, given, "V-JEPA", source)
    n = tensor_shape(enc, "pos_embed", source, "encoder", 3)[-2] if "pos_embed" in enc else None
    if "num_frames" not in given and fields["model"] == "tiny":
        raise InputError(f"{source}: the frames per clip of an encoder of another size than the releases cannot be "
                         "read from its shapes; give --num-frames")
    frames = int(given.get("num_frames", VJEPA_FRAMES))
    if "image_size" in given:
        image = int(given["image_size"])
    elif n is None:
        raise InputError(f"{source}: the encoder has no pos_embed to tell the crop size from; give --image-size")
    else:
        side = math.isqrt(n // max(frames // tubelet, 1)) if frames >= tubelet else 0
        if frames % tubelet or side * side * (frames // tubelet) != n:
            raise InputError(f"{source}: {n} position embeddings are not {frames} frames (in tubelets of {tubelet}) of "
                             "a square grid; give --num-frames (and --image-size)")
        image = side * patch
    if fields["model"] != "tiny" and (patch, tubelet, frames, image) not in {
            (VJEPA_PATCH, VJEPA_TUBELET, VJEPA_FRAMES, s) for s in VJEPA_IMAGE_SIZES}:
        raise InputError(f"{source}: a {fields['model']} encoder with patch {patch}, tubelet {tubelet}, {frames} frames "
                         f"at {image} px is not a V-JEPA release (ViT-L/16, ViT-H/16 at 224 px, ViT-H/16 at 384 px); "
                         "give --heads to import it as another size")
    config = {**fields, "patch_size": patch, "image_size": image, "num_frames": frames, "tubelet_size": tubelet,
              "channels": channels, **_predictor_fields(pred, source, given)}
    return {k: v for k, v in config.items() if v is not None}


def infer_audio_config(parts: Mapping[str, Mapping[str, Any]], source: Path,
                       given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The AudioJEPAConfig model fields of an Audio-JEPA checkpoint, from its shapes alone: width and
    patch from the Conv2d weight [D, 1, p, p] (square patches), depths from the block numbers, the
    predictor width from predictor_embed [W, D], and the spectrogram's frames from pos_embed [1, N, D]
    with `mel_bins` (128 unless given). `given` (heads, pred_heads, mel_bins) completes them."""
    given = {k: v for k, v in (given or {}).items() if v is not None}
    enc, pred = encoder_part(parts), parts.get("predictor")
    width, channels, pt, pf = tensor_shape(enc, "patch_embed.proj.weight", source, "encoder", 4)
    if channels != 1:
        raise InputError(f"{source}: a patch embedding of {channels} input channels; Audio-JEPA reads one-channel "
                         "spectrograms (an image model? try --objective ijepa)")
    if pt != pf:
        raise InputError(f"{source}: patches of {pt} frames x {pf} mel bins; the import takes square patches only")
    depth = _depth(enc, "blocks.", source, "encoder")
    fields = _heads(AUDIO_RELEASES, width, depth, given, "Audio-JEPA", source)
    if "mel_bins" not in given and fields["model"] == "tiny":
        raise InputError(f"{source}: the mel bins of an encoder of another size than the release cannot be read "
                         "from its shapes; give --mel-bins")
    mel = int(given.get("mel_bins", AUDIO_MEL_BINS))
    n = tensor_shape(enc, "pos_embed", source, "encoder", 3)[-2]
    if mel % pt or n % (mel // pt):
        raise InputError(f"{source}: {n} position embeddings are not a grid of {mel} mel bins in patches of {pt}; "
                         "give --mel-bins")
    config = {**fields, "patch_size": pt, "mel_bins": mel, "frames": n // (mel // pt) * pt,
              **_predictor_fields(pred, source, given)}
    return {k: v for k, v in config.items() if v is not None}


def model_config(family: str, shapes: Mapping[str, Mapping[str, Any]], recorded: Mapping[str, Any],
                 options: Mapping[str, Any], defaults: Mapping[str, Any], source: Path) -> dict[str, Any]:
    """The model fields of a `family` checkpoint whose tensors have `shapes`: I-JEPA's are the options
    given (over the file's `recorded` geometry, over `defaults`) with the input channels of its patch
    embedding [D, C, p, p]; V-JEPA's and Audio-JEPA's are read from the shapes, completed by the
    options and the record."""
    given = {**recorded, **{k: v for k, v in options.items() if v is not None}}
    if family == "ijepa":
        encoder_shape = tensor_shape(encoder_part(shapes), "patch_embed.proj.weight", source, "encoder", 4)
        return {**defaults, **given, "channels": encoder_shape[1]}
    model = infer_vjepa_config(shapes, source, given) if family == "vjepa" else infer_audio_config(shapes, source, given)
    # what the shapes do not tell and inference does not take
    model.update({k: recorded[k] for k in ("mlp_ratio", "mean", "std") if k in recorded})
    return model


def check_shapes(ours: Any, want: Any, source: Path, what: str) -> None:
    """InputError naming the first tensor of the converted `ours` that the chosen model's `want`
    lacks, holds at another shape, or does not have."""
    have = {jax.tree_util.keystr(p): np.shape(v) for p, v in jax.tree_util.tree_flatten_with_path(ours)[0]}
    need = {jax.tree_util.keystr(p): tuple(v.shape) for p, v in jax.tree_util.tree_flatten_with_path(want)[0]}
    for name in sorted(need):
        if name not in have:
            raise InputError(f"{source}: the {what} lacks {name} that the chosen model has (another model size "
                             "or depth? check --model, --patch-size and the predictor options)")
        if have[name] != need[name]:
            raise InputError(f"{source}: the {what}'s {name} is {list(have[name])}, the chosen model's is "
                             f"{list(need[name])} (check --model, --patch-size and the predictor options)")
    extra = sorted(set(have) - set(need))
    if extra:
        raise InputError(f"{source}: the {what} has {extra[0]} that the chosen model lacks (a deeper model? "
                         "check --model and the predictor options)")


def check_positions(shapes: Mapping[str, Mapping[str, Any]], model: Any, source: Path, family: str) -> None:
    """InputError when a position table the file holds is not the chosen model's (an --image-size,
    --patch-size, --num-frames or --mel-bins that contradicts the file's grid)."""
    grid = tuple(getattr(model, "grid3d", model.grid))  # V-JEPA: (frames / tubelet, rows, columns)
    options = {"ijepa": "--image-size and --patch-size", "vjepa": "--image-size and --num-frames",
               "audio-jepa": "--mel-bins"}[family]
    tables = (("encoder", "pos_embed", model.embed_dim), ("target_encoder", "pos_embed", model.embed_dim),
              ("predictor", "predictor_pos_embed", model.pred_width))
    for part, table, width in tables:
        if part in shapes and table in shapes[part]:
            have = tuple(shapes[part][table].shape)
            need = (1, math.prod(grid), width)
            if have != need:
                raise InputError(f"{source}: the {part.replace('_', ' ')}'s {table} is {list(have)}, the chosen "
                                 f"model's {'x'.join(map(str, grid))} grid of tokens needs {list(need)} "
                                 f"(check {options})")
