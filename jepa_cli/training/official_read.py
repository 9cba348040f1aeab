"""Reading a published JEPA checkpoint (training/import_official.py imports it as a run): the file
(torch.save or a `jepa export` .safetensors), which official family it is (`detect_family`), its
encoder, predictor and target encoder state dicts, and the model geometry `jepa export` records."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from jepa_cli.errors import InputError
from jepa_cli.models.convert import strip_wrappers
from jepa_cli.models.torch_checkpoint import TensorRef, read_torch_checkpoint
from jepa_cli.training.export_official import MODEL_KEY

IN1K_IPE = 625  # in1k_vith14_ep300.yaml: 1,281,167 images // (16 GPUs x batch 128)
IN1K_EPOCHS = 300  # in1k_vith14_ep300.yaml: optimization.epochs
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


def _is_tensor(value: Any) -> bool:
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
    from jepa_cli.models.template import first_non_finite  # JAX and Flax: not for telling a file's family

    for key, part in parts.items():
        found = first_non_finite(part)
        if found is not None:
            path, bad, size = found
            raise InputError(f"{source}: {key} tensor {path[0].key} holds {bad} non-finite value(s) (NaN or inf) "
                             f"of {size}; a run needs finite weights")


# the recorded geometry fields each family's import takes (the rest its shapes tell)
RECORDED = {"ijepa": ("model", "width", "depth", "heads", "mlp_ratio", "patch_size", "image_size", "pred_width",
                      "pred_depth", "pred_heads", "mean", "std"),
            "vjepa": ("heads", "pred_heads", "num_frames", "image_size", "pred_width", "pred_depth", "mean", "std"),
            "audio-jepa": ("heads", "pred_heads", "mel_bins", "pred_width", "pred_depth")}


def recorded_model(checkpoint: Mapping, source: Path, family: str) -> dict[str, Any]:
    """The import options that `jepa export`'s geometry record (`jepa_model`) gives for `family`; {}
    for a file without one (the official releases). InputError naming the file for a record that is
    not the geometry export writes."""
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
    from safetensors import SafetensorError, safe_open

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
    if source.name.lower().endswith(".safetensors"):
        return _safetensors(source, objective, load=keys is None or bool(keys))
    return read_torch_checkpoint(source, keys=keys, inert=inert)
