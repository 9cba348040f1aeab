"""A published JEPA checkpoint -> a run directory like the ones `jepa train` writes, so
`encode-latents`, `probe`, `ema-inspect` and `train --resume` read it like any other run.

Three official layouts (the family is told by the file: `detect_family`):
- ``ijepa``: facebookresearch/ijepa's `torch.save` of a dict with `encoder`, `predictor`,
  `target_encoder`, `opt`, `epoch`, ... (a Conv2d patch embedding); the model is given by options.
- ``vjepa``: facebookresearch/jepa's, the same keys (a Conv3d tubelet embedding, `backbone.` names
  of MultiMaskWrapper); the model is read from the shapes: ViT-L/16 and ViT-H/16 at 224 px and
  ViT-H/16 at 384 px are the releases, any other size needs its heads given.
- ``audio-jepa``: LudovicTuncay/Audio-JEPA's PyTorch Lightning checkpoint, a `state_dict` of
  `encoder.`, `target_encoder.` and `predictor.` names (its hyper-parameters pickle other classes:
  they are kept inert, never run); the model is read from the shapes (ViT-B/16 the release).

A file of one encoder (`jepa export` without `--all`: `target_encoder` or `encoder` alone, with no
predictor) imports as an encoder-only run: that encoder is both the params' encoder and the EMA, the
predictor is zeros, and run.json's `imported.parts` names the one part; it encodes and probes like
any run, and `train --resume` refuses it (`check_resumable`). `jepa export`'s own files record the
model's geometry (`jepa_model`, training/export_official.py) and read back without options; the
options given win over it, field by field. A `.safetensors` export reads back too (its metadata
names the objective, parts and epoch).

What is imported: the context encoder and the predictor as the run's params, the target encoder as
its EMA, the step (`epoch x ipe` for the official dicts, which store epochs; Lightning's
`global_step`). What is not: the optimizer's moments (AdamW starts from zero on `--resume`) and the
data position (a resumed run starts its data from the beginning). run.json records the source
file's name and SHA-256; the checkpoint's digest (training/checkpoint.py) is checked against its
files before the run is moved into place. Shapes are checked before any tensor's bytes are read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from jepa_cli.errors import InputError

IN1K_IPE = 625  # in1k_vith14_ep300.yaml: 1,281,167 images // (16 GPUs x batch 128)
IN1K_EPOCHS = 300  # in1k_vith14_ep300.yaml: optimization.epochs
MAX_STEP = 2**31 - 1  # TrainState.step is int32
PARTS = ("encoder", "predictor", "target_encoder")


@dataclasses.dataclass(frozen=True)
class Family:
    """How one official codebase's checkpoints import: the objective, the recipe whose trainer
    values a resumed run takes (None: the trainer's defaults), and the official run's length."""

    objective: str
    title: str  # as the user knows it
    format: str  # what run.json records
    recipe: str | None
    ipe: int | None  # iterations per epoch of the official run (None: from the checkpoint)
    epochs: int
    batch_size: int


FAMILIES = {
    "ijepa": Family("ijepa", "I-JEPA", "facebookresearch/ijepa checkpoint (torch.save)", None, IN1K_IPE, IN1K_EPOCHS,
                    2048),  # in1k_vith14: 16 GPUs x 128
    # configs/pretrain/vitl16.yaml, vith16.yaml: optimization.ipe 300, epochs 300, 24 x 128 GPUs
    "vjepa": Family("vjepa", "V-JEPA", "facebookresearch/jepa checkpoint (torch.save)", "builtin:vjepa-vitl16", 300,
                    300, 3072),
    # configs/trainer max_epochs 50 (recipe audio-jepa-as2m); the batch is not in the released configs
    "audio-jepa": Family("audio-jepa", "Audio-JEPA", "LudovicTuncay/Audio-JEPA Lightning checkpoint",
                         "builtin:audio-jepa-as2m", None, 50, 256),
}

# (width, depth) -> (our size name, heads) of the released encoders
VJEPA_RELEASES = {(1024, 24): ("large", 16), (1280, 32): ("huge", 16)}  # vit_large, vit_huge
VJEPA_FRAMES, VJEPA_TUBELET, VJEPA_PATCH = 16, 2, 16  # data.num_frames, tubelet_size, patch_size
VJEPA_IMAGE_SIZES = (224, 384)  # vitl16 / vith16 crop_size 224, vith16_384 crop_size 384
AUDIO_RELEASES = {(768, 12): ("base", 12)}  # configs/model/jepa.yaml encoder 768 / 12 / 12
AUDIO_MEL_BINS = 128  # Audio-JEPA: 128 mel bins


@dataclasses.dataclass(frozen=True)
class ImportOptions:
    """What the checkpoint does not say. `objective_config`: for ijepa the model (as `jepa train
    --objective ijepa` options); for vjepa and audio-jepa options that override or complete what the
    shapes tell (heads, pred_heads, num_frames, mel_bins). The official run's length (for the step and
    the schedules of a resumed run): None is the family's."""

    objective_config: dict[str, Any]
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # below the file's own record
    ipe: int | None = None
    epochs: int | None = None
    batch_size: int | None = None
    seed: int = 0


def _is_tensor(value: Any) -> bool:
    from jepa_cli.models.torch_checkpoint import TensorRef

    return isinstance(value, (np.ndarray, TensorRef))


def _state_dict(part: Any) -> bool:
    return isinstance(part, Mapping) and all(isinstance(k, str) and _is_tensor(v) for k, v in part.items())


def _lightning_parts(checkpoint: Mapping) -> dict[str, dict[str, Any]] | None:
    """{'encoder', 'predictor', 'target_encoder'} of a Lightning `state_dict` (names without the
    module attribute), or None when the checkpoint is not one."""
    state = checkpoint.get("state_dict")
    if not isinstance(state, Mapping):
        return None
    parts: dict[str, dict[str, Any]] = {p: {} for p in PARTS}
    for name, value in state.items():
        if isinstance(name, str):
            head, _, rest = name.partition(".")
            if head in parts:
                parts[head][rest] = value
    return parts if any(parts.values()) else None


def detect_family(checkpoint: Any, source: Path) -> str:
    """'ijepa', 'vjepa' or 'audio-jepa' from a checkpoint's structure (shapes only): a Lightning
    state_dict is Audio-JEPA's; an official dict with a 5-D (Conv3d) patch embedding V-JEPA's, a 4-D
    one I-JEPA's. InputError for anything else."""
    if not isinstance(checkpoint, Mapping):
        raise InputError(f"{source}: holds a {type(checkpoint).__name__}, not the dict of a JEPA checkpoint")
    if "state_dict" in checkpoint and not any(k in checkpoint for k in PARTS):
        if _lightning_parts(checkpoint) is None:
            raise InputError(f"{source}: a Lightning checkpoint, but its state_dict has no encoder., predictor. or "
                             "target_encoder. parameters (not an Audio-JEPA checkpoint)")
        return "audio-jepa"
    missing = [k for k in PARTS if k not in checkpoint] if one_encoder(checkpoint) is None else []
    if missing:
        raise InputError(f"{source}: not an I-JEPA, V-JEPA or Audio-JEPA checkpoint (no {', '.join(missing)}; it has "
                         f"{', '.join(sorted(map(str, checkpoint)))[:200] or 'nothing'})")
    encoder = checkpoint[one_encoder(checkpoint) or "encoder"]
    if isinstance(encoder, Mapping):
        from jepa_cli.models.convert import strip_wrappers

        for name, value in encoder.items():
            if isinstance(name, str) and strip_wrappers(name) == "patch_embed.proj.weight" and _is_tensor(value):
                if len(value.shape) == 5:
                    return "vjepa"
                if len(value.shape) == 4:
                    return "ijepa"
    raise InputError(f"{source}: its encoder has no 4-D (image) or 5-D (video) patch_embed.proj.weight: not an "
                     "I-JEPA or V-JEPA encoder")


def one_encoder(checkpoint: Mapping) -> str | None:
    """'encoder' or 'target_encoder' for a checkpoint that holds that one encoder and no predictor
    (`jepa export` without --all), None for any other: an official dict's keys, or the parts of a
    Lightning state_dict."""
    parts = _lightning_parts(checkpoint) if "state_dict" in checkpoint and not any(k in checkpoint for k in PARTS) \
        else {k: checkpoint.get(k) for k in PARTS}
    if parts is None:
        return None
    present = [k for k in PARTS if parts.get(k)]
    return present[0] if len(present) == 1 and present[0] != "predictor" else None


def official_parts(checkpoint: Any, source: Path, family: str = "ijepa") -> dict[str, Mapping[str, Any]]:
    """{'encoder', 'predictor', 'target_encoder'} state dicts (names without wrapper prefixes) of a
    loaded checkpoint of `family`, their tensors NumPy arrays or TensorRefs (shapes); of a file of
    one encoder (`one_encoder`), that part alone."""
    from jepa_cli.models.convert import strip_wrappers

    title = FAMILIES[family].title
    if family == "audio-jepa":
        parts = _lightning_parts(checkpoint) if isinstance(checkpoint, Mapping) else None
        if parts is None:
            raise InputError(f"{source}: not an Audio-JEPA Lightning checkpoint (no state_dict of encoder., "
                             "predictor. and target_encoder. parameters)")
        single = one_encoder(checkpoint)
        if single is not None:
            parts = {single: parts[single]}
        missing = [k for k in PARTS if k not in parts or not parts[k]] if single is None else []
        if missing:
            raise InputError(f"{source}: its state_dict has no {', '.join(k + '.' for k in missing)} parameters "
                             "(an Audio-JEPA checkpoint has encoder, predictor and target_encoder)")
    else:
        if not isinstance(checkpoint, Mapping):
            raise InputError(f"{source}: holds a {type(checkpoint).__name__}, not the dict of an {title} checkpoint")
        single = one_encoder(checkpoint)
        missing = [k for k in PARTS if k not in checkpoint] if single is None else []
        if missing:
            raise InputError(f"{source}: not an {title} checkpoint (no {', '.join(missing)}; it has "
                             f"{', '.join(sorted(map(str, checkpoint)))[:200] or 'nothing'})")
        parts = {k: checkpoint[k] for k in ((single,) if single else PARTS)}
    out = {}
    for key, part in parts.items():
        if not _state_dict(part):
            raise InputError(f"{source}: {key} is not a state dict of tensors (names to tensors)")
        out[key] = {strip_wrappers(name): value for name, value in part.items()}
    return out


def check_finite(parts: Mapping[str, Mapping[str, np.ndarray]], source: Path) -> None:
    """InputError naming the tensor for one that holds NaN or inf (a diverged run's weights)."""
    from jepa_cli.models.template import first_non_finite

    for key, part in parts.items():
        found = first_non_finite(part)
        if found is not None:
            path, bad, size = found
            raise InputError(f"{source}: {key} tensor {path[0].key} holds {bad} non-finite value(s) (NaN or inf) "
                             f"of {size}; a run needs finite weights")


def _shape(part: Mapping[str, Any], name: str, source: Path, what: str, ndim: int | None = None) -> tuple[int, ...]:
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


def _encoder_of(parts: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    """The context encoder's state dict, or the one encoder of a one-encoder file."""
    return parts["encoder"] if "encoder" in parts else parts["target_encoder"]


def _predictor_fields(pred: Mapping[str, Any] | None, source: Path, given: Mapping[str, Any]) -> dict[str, Any]:
    """pred_width and pred_depth from the predictor's shapes (None: a one-encoder file, whose
    predictor is the given one or the objective's default), pred_heads as given."""
    if pred is None:
        return {k: given.get(k) for k in ("pred_width", "pred_depth", "pred_heads")}
    return {"pred_width": _shape(pred, "predictor_embed.weight", source, "predictor", 2)[0],
            "pred_depth": _depth(pred, "predictor_blocks.", source, "predictor"), "pred_heads": given.get("pred_heads")}


def infer_vjepa_config(parts: Mapping[str, Mapping[str, Any]], source: Path,
                       given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The VJEPAConfig model fields of a V-JEPA checkpoint, from its shapes alone: width, channels,
    tubelet and patch from the Conv3d weight [D, C, t, p, p]; depth and predictor depth from the
    block numbers; the predictor width from predictor_embed [W, D]; the grid from pos_embed [1, N, D]
    with `num_frames` (16, as every release, unless given) and a square crop. `given` (heads,
    pred_heads, num_frames, image_size) completes what shapes cannot tell."""
    given = {k: v for k, v in (given or {}).items() if v is not None}
    enc, pred = _encoder_of(parts), parts.get("predictor")
    width, channels, tubelet, patch, patch_w = _shape(enc, "patch_embed.proj.weight", source, "encoder", 5)
    if patch != patch_w:
        raise InputError(f"{source}: patches of {patch}x{patch_w} pixels; the ViT here takes square patches")
    depth = _depth(enc, "blocks.", source, "encoder")
    fields = _heads(VJEPA_RELEASES, width, depth, given, "V-JEPA", source)
    n = _shape(enc, "pos_embed", source, "encoder", 3)[-2] if "pos_embed" in enc else None
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
    enc, pred = _encoder_of(parts), parts.get("predictor")
    width, channels, pt, pf = _shape(enc, "patch_embed.proj.weight", source, "encoder", 4)
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
    n = _shape(enc, "pos_embed", source, "encoder", 3)[-2]
    if mel % pt or n % (mel // pt):
        raise InputError(f"{source}: {n} position embeddings are not a grid of {mel} mel bins in patches of {pt}; "
                         "give --mel-bins")
    config = {**fields, "patch_size": pt, "mel_bins": mel, "frames": n // (mel // pt) * pt,
              **_predictor_fields(pred, source, given)}
    return {k: v for k, v in config.items() if v is not None}


# the recorded geometry fields each family's import takes (the rest its shapes tell)
RECORDED = {"ijepa": ("model", "width", "depth", "heads", "mlp_ratio", "patch_size", "image_size", "pred_width",
                      "pred_depth", "pred_heads", "mean", "std"),
            "vjepa": ("heads", "pred_heads", "num_frames", "image_size", "pred_width", "pred_depth", "mean", "std"),
            "audio-jepa": ("heads", "pred_heads", "mel_bins", "pred_width", "pred_depth")}


def recorded_model(checkpoint: Mapping, source: Path, family: str) -> dict[str, Any]:
    """The import options that `jepa export`'s geometry record (`jepa_model`) gives for `family`; {}
    for a file without one (the official releases). InputError naming the file for a record that is
    not the geometry export writes."""
    from jepa_cli.training.export_official import MODEL_KEY

    record = checkpoint.get(MODEL_KEY)
    if record is None:
        return {}
    if not isinstance(record, Mapping):
        raise InputError(f"{source}: its {MODEL_KEY} is a {type(record).__name__}, not the geometry record jepa "
                         "export writes")
    if record.get("objective", family) != family:
        raise InputError(f"{source}: its {MODEL_KEY} describes a {str(record.get('objective'))[:40]!r} model, the "
                         f"file holds an {FAMILIES[family].title} one")
    out = {}
    for key in RECORDED[family]:
        value = record.get(key)
        if value is None:
            continue
        if key == "model":
            ok = isinstance(value, str)
        elif key == "mlp_ratio":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1e3
        elif key in ("mean", "std"):
            ok = isinstance(value, list) and 0 < len(value) <= 64 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)
        else:
            ok = type(value) is int and 0 < value <= 2**20
        if not ok:
            raise InputError(f"{source}: its {MODEL_KEY} has {key} {str(value)[:40]!r}, not the "
                             f"{'size name' if key == 'model' else 'numbers' if key in ('mean', 'std') else 'positive number'} "
                             "jepa export writes")
        out[key] = value
    return out


def _safetensors(source: Path, objective: str | None, load: bool) -> dict[str, Any]:
    """A `jepa export` .safetensors file as the checkpoint its objective's trainer saves (a dict of
    parts, or Lightning's state_dict), tensors loaded (`load`) or zero-stride stand-ins of their
    shapes. Its metadata names the objective (else `objective`), the parts, epoch and step."""
    import json

    from safetensors import SafetensorError, safe_open

    from jepa_cli.training.export_official import MODEL_KEY

    if not source.is_file():
        raise InputError(f"{source}: no such checkpoint file")
    try:
        with safe_open(str(source), "np") as f:
            meta = f.metadata() or {}
            tensors = {name: (f.get_tensor(name) if load else
                              np.broadcast_to(np.float32(0), tuple(f.get_slice(name).get_shape())))
                       for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise InputError(f"{source}: not a readable safetensors file ({str(exc)[:120]})") from None
    family = meta.get("objective") or objective
    if family not in FAMILIES:
        raise InputError(f"{source}: its metadata names no I-JEPA, V-JEPA or Audio-JEPA objective (jepa export "
                         "records it); give --objective")
    parts = [p for p in str(meta.get("parts", "")).split(",") if p in PARTS] or ["target_encoder"]
    if len(parts) == 1:
        state = {parts[0]: tensors}
    else:
        state = {p: {k[len(p) + 1:]: v for k, v in tensors.items() if k.startswith(p + ".")} for p in parts}

    def count(key: str) -> int:
        value = str(meta.get(key, "0"))
        if not (value.isascii() and value.isdigit()):
            raise InputError(f"{source}: its metadata's {key} is {value[:40]!r}, not a count")
        return int(value)

    checkpoint: dict[str, Any] = {"epoch": count("epoch")}
    if meta.get(MODEL_KEY):
        try:
            checkpoint[MODEL_KEY] = json.loads(meta[MODEL_KEY])
        except ValueError:
            raise InputError(f"{source}: its metadata's {MODEL_KEY} is not JSON") from None
    if family == "audio-jepa":
        checkpoint.update(global_step=count("step"),
                          state_dict={f"{p}.{k}": v for p, part in state.items() for k, v in part.items()})
    else:
        checkpoint.update(state)
    return checkpoint


def read_checkpoint(source: Path, keys: tuple[str, ...] | None = (), objective: str | None = None,
                    inert: bool = True) -> Any:
    """The checkpoint at `source`: a torch.save file (tensors under `keys` loaded, the rest their
    shapes; hyper-parameters of other classes kept inert), or a `jepa export` .safetensors (`keys`
    empty: shapes only)."""
    from jepa_cli.models.torch_checkpoint import read_torch_checkpoint

    if source.name.lower().endswith(".safetensors"):
        return _safetensors(source, objective, load=keys is None or bool(keys))
    return read_torch_checkpoint(source, keys=keys, inert=inert)


def check_resumable(record: Mapping[str, Any], run: str | Path) -> None:
    """InputError for `train --resume` of an encoder-only run (imported from a file of one encoder)."""
    imported = record.get("imported")
    parts = imported.get("parts") if isinstance(imported, Mapping) else None
    if isinstance(parts, list) and "predictor" not in parts:
        raise InputError(f"{run}: an encoder-only run (imported from {imported.get('source')}, which holds the "
                         f"{' and '.join(str(p).replace('_', ' ') for p in parts)} alone): it holds no predictor "
                         "and no optimizer state to resume; it encodes and probes, and `jepa train` starts a new run")


def _check_shapes(ours: Any, want: Any, source: Path, what: str) -> None:
    import jax

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


def _check_positions(shapes: Mapping[str, Mapping[str, Any]], model: Any, source: Path, family: str) -> None:
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


def _check_written(step_dir: Path, out: str | Path) -> None:
    """The checkpoint just written has its digest and its files match it (a disk that lost or changed
    bytes on the way is caught before the run is moved into place)."""
    from jepa_cli.errors import JepaError
    from jepa_cli.training.checkpoint import DIGEST_FILE, digest_problem

    problem = digest_problem(step_dir) if (step_dir / DIGEST_FILE).is_file() else f"no {DIGEST_FILE} was written"
    if problem is not None:
        raise JepaError(f"{out}: the imported checkpoint does not read back as written ({problem}); nothing written")


def _listing(directory: Path) -> list[tuple[str, int]]:
    """Every file under `directory` with its size (what a writer still at work there changes)."""
    out = []
    for root, _dirs, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):
                out.append((os.path.join(root, name), os.path.getsize(os.path.join(root, name))))
    return sorted(out)


@contextlib.contextmanager
def _settled_on_failure(directory: Path) -> Iterator[None]:
    """On an exception in the block, waits for the writes still running into `directory` before
    raising it: a failed orbax save (a full disk) leaves its other writes going, in threads it started
    and in TensorStore's, and one of them would otherwise recreate the directory once the failure
    has removed it. They are waited for until nothing under `directory` changes (30 s at most)."""
    started = set(threading.enumerate())
    try:
        yield
    except BaseException:
        deadline = time.monotonic() + 30
        for thread in set(threading.enumerate()) - started:
            with contextlib.suppress(Exception):  # orbax's threads raise their own failure from join
                thread.join(max(0.0, deadline - time.monotonic()))
        before = _listing(directory)
        while time.monotonic() < deadline:
            time.sleep(0.2)
            now = _listing(directory)
            if now == before:
                break
            before = now
        raise


def _step(checkpoint: Mapping, family: Family, options: ImportOptions, source: Path) -> tuple[int, int, int]:
    """(step, epoch, ipe): Lightning's global_step, or the official dicts' epoch x ipe."""
    epoch = checkpoint.get("epoch", 0)
    if type(epoch) is not int or epoch < 0:  # a bool is an int to Python, not a count
        raise InputError(f"{source}: its epoch is {str(epoch)[:40]}, not a count of epochs")
    if family.objective == "audio-jepa":
        step = checkpoint.get("global_step", 0)
        if type(step) is not int or step < 0:
            raise InputError(f"{source}: its global_step is {str(step)[:40]}, not a count of updates")
        if step > MAX_STEP:
            raise InputError(f"{source}: its global_step {step} is past the last step a run can hold ({MAX_STEP:,})")
        # the updates per epoch the checkpoint itself shows, unless given
        ipe = options.ipe or max(1, step // epoch if epoch else step)
        return step, epoch, ipe
    ipe = options.ipe or family.ipe
    if epoch * ipe > MAX_STEP:
        raise InputError(f"{source}: its epoch {str(epoch)[:40]} x --ipe {ipe} is past the last step a run "
                         f"can hold ({MAX_STEP:,}, the int32 step counter)")
    return epoch * ipe, epoch, ipe


def _train_config(family: Family, options: ImportOptions, ipe: int, out: str | Path) -> tuple[Any, dict, dict]:
    """(TrainConfig, lengths, the recipe's objective table): the family's recipe (V-JEPA's vitl16, the
    Audio-JEPA AS-2M one) with the official run's length, or for I-JEPA the trainer's defaults."""
    from jepa_cli.training.config import build_config, load_toml, merge, resolve_lengths

    recipe = load_toml(family.recipe) if family.recipe else {}
    table = recipe.pop("objective_config", {})
    epochs = options.epochs or family.epochs
    batch = options.batch_size or recipe.get("batch_size") or family.batch_size
    values = merge(recipe, {"objective": family.objective, "epochs": float(epochs), "batch_size": batch,
                            "seed": options.seed, "out": str(out), "data": None})
    values.pop("steps", None)  # the length is epochs x ipe
    cfg = build_config(values)
    return cfg, resolve_lengths(cfg, ipe * batch), table


def import_checkpoint(source: str | Path, out: str | Path, options: ImportOptions, objective: str | None = None,
                      log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Writes RUN `out` (atomically: all of it or nothing) from the official checkpoint `source` of
    `objective` (None: told by the file; given, it must agree). Returns a summary: the run, its
    objective, step, epoch, the source's SHA-256, parameter counts."""
    import jax

    from jepa_cli.data.atomic import atomic_directory
    from jepa_cli.models.convert import from_official
    from jepa_cli.errors import storage_failure
    from jepa_cli.training.abandoned_reads import silence_abandoned_reads
    from jepa_cli.training.checkpoint import Checkpoints, sha256_of
    from jepa_cli.training.run import build_optimizer, make_objective, objective_config_of
    from jepa_cli.training.runfiles import write_run
    from jepa_cli.training.state import TrainState

    source = Path(source)
    if os.path.lexists(out):  # before reading anything
        raise InputError(f"{out}: already exists (import-checkpoint never replaces a path: remove it or choose "
                         "another name)")
    # shapes first (no tensor read): the family, the model and every shape are checked before the bytes
    layout = read_checkpoint(source, keys=(), objective=objective)
    detected = detect_family(layout, source)
    if objective is not None and objective != detected:
        raise InputError(f"{source}: an {FAMILIES[detected].title} checkpoint, not an {FAMILIES[objective].title} "
                         f"one (use --objective {detected}, or leave --objective out)")
    family = FAMILIES[detected]
    # zero-stride stand-ins of each tensor's shape: converted and checked without allocating it
    shapes = {k: {name: np.broadcast_to(np.float32(0), ref.shape) for name, ref in part.items()}
              for k, part in official_parts(layout, source, detected).items()}
    present = tuple(k for k in PARTS if k in shapes)  # all three, or the one encoder of a one-encoder file
    try:  # every name checked against the official model's before its size is read from them
        convert = {k: from_official(shapes[k], predictor=k == "predictor", family=detected) for k in present}
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None
    recorded = recorded_model(layout, source, detected)
    given = {**recorded, **{k: v for k, v in options.objective_config.items() if v is not None}}
    if detected == "ijepa":  # the model is the options', its input channels the patch embedding's [D, C, p, p]
        encoder_shape = _shape(_encoder_of(shapes), "patch_embed.proj.weight", source, "encoder", 4)
        model = {**options.defaults, **given, "channels": encoder_shape[1]}
    elif detected == "vjepa":
        model = infer_vjepa_config(shapes, source, given)
    else:
        model = infer_audio_config(shapes, source, given)
    if detected != "ijepa":  # what the shapes do not tell and inference does not take
        model.update({k: recorded[k] for k in ("mlp_ratio", "mean", "std") if k in recorded})
    step, epoch, ipe = _step(layout, family, options, source)
    cfg, lengths, table = _train_config(family, options, ipe, out)
    # the imported weights are float32 and so is their compute: features as the official float32 model's
    config = {**table, **model, "dtype": "float32"} if detected != "ijepa" else model
    objective_ = make_objective(family.objective, config, lengths["ema_t_max"])
    cfg.objective_config = objective_config_of(objective_, config)

    want = objective_.param_shapes()
    for part in present:
        _check_shapes(convert[part], want["predictor" if part == "predictor" else "encoder"], source,
                      part.replace("_", " "))
    _check_positions(shapes, objective_.model_config, source, detected)

    checkpoint = read_checkpoint(source, keys=("state_dict",) if detected == "audio-jepa" else present,
                                 objective=detected, inert=detected == "audio-jepa")
    parts = official_parts(checkpoint, source, detected)
    check_finite(parts, source)
    if len(present) == 1:  # an encoder-only run: the one encoder is both, the predictor zeros
        encoder = from_official(parts[present[0]], family=detected)
        params = {"encoder": encoder, "predictor": jax.tree.map(lambda w: np.zeros(w.shape, w.dtype),
                                                                want["predictor"])}
        target = encoder
    else:
        params = {"encoder": from_official(parts["encoder"], family=detected),
                  "predictor": from_official(parts["predictor"], predictor=True, family=detected)}
        target = from_official(parts["target_encoder"], family=detected)
    params = jax.tree.map(lambda v, w: np.asarray(v, w.dtype), params, want)
    target = jax.tree.map(lambda v, w: np.asarray(v, w.dtype), target, want["encoder"])

    tx, *_ = build_optimizer(cfg, objective_, lengths, want)
    init_key, rng = jax.random.split(jax.random.PRNGKey(options.seed))  # as state.init_state splits
    del init_key
    state = TrainState(params=params, ema=target, opt_state=tx.init(params),
                       step=np.asarray(step, np.int32), rng=np.asarray(rng))
    digest = sha256_of(source)
    record = {"jepa_kind": "run", "config": cfg.to_dict(), "lengths": lengths, "dataset": None,
              "status": "imported",
              "imported": {"source": source.name, "sha256": digest, "epoch": epoch, "ipe": ipe,
                           "format": family.format, "parts": list(present)}}
    # A failed write (a full disk) leaves orbax's other writes in flight, each printing a traceback
    # from its thread: dropped, the error's one line says it all
    silence_abandoned_reads()
    try:
        with atomic_directory(out, force=False, kind="run", inputs=[source], log=log) as tmp:
            record["config"]["out"] = str(out)
            with _settled_on_failure(tmp):
                ckpts = Checkpoints(tmp, keep=None, async_save=False)
                try:
                    ckpts.save(step, state.as_dict(), {}, {**record["config"], "lengths": lengths})
                except BaseException:
                    with contextlib.suppress(Exception):  # the save's own failure is the one to report
                        ckpts.close()
                    raise
                ckpts.close()
                _check_written(tmp / "checkpoints" / str(step), out)
                write_run(tmp, record)
    except Exception as exc:
        failure = storage_failure(exc)
        if failure is None:
            raise
        raise InputError(f"{out}: {failure.rsplit(': ', 1)[-1]} while writing it; nothing written") from None
    count = lambda tree: int(sum(np.size(v) for v in jax.tree.leaves(tree)))  # noqa: E731
    return {"run": str(out), "objective": detected, "step": step, "epoch": epoch, "source": str(source),
            "sha256": digest, "encoder_params": count(params["encoder"]),
            "predictor_params": count(params["predictor"])}
