"""A run's weights in the official layout of its objective, as a PyTorch checkpoint or safetensors
(`jepa export`); the inverse of training/import_official.py.

The names and layouts are models/convert.py's table of each family (`to_official`, the inverse of
the importer's `from_official`), with the fixed sin-cos tables (`pos_embed`, `predictor_pos_embed`)
that the official modules hold as frozen parameters. The `.pth.tar` file is what each official
trainer saves (`OFFICIAL`):
- I-JEPA (facebookresearch/ijepa src/train.py save_checkpoint) and V-JEPA (facebookresearch/jepa
  app/vjepa/train.py save_checkpoint): a dict with the `encoder` (context encoder), `predictor` and
  `target_encoder` state dicts and `epoch` (whole epochs done); names carry the prefix of the
  wrappers they were saved through (DistributedDataParallel's `module.`; V-JEPA's MultiMaskWrapper
  adds `backbone.`).
- Audio-JEPA (LudovicTuncay/Audio-JEPA, PyTorch Lightning): `epoch`, `global_step` and a
  `state_dict` of the LightningModule's names (`encoder.`, `target_encoder.`, `predictor.`), which
  `module.load_state_dict(checkpoint["state_dict"])` takes. Lightning's hyper-parameters, loops
  and callbacks (pickles of the official classes) are not written.

By default only one encoder is written (`weights`: the target, as the JEPAs evaluate, under
`target_encoder`; or the context encoder, under `encoder`); `full` writes all three, which `jepa
import-checkpoint` reads back. The optimizer's moments are not written (the importer does not read
them either). A run whose model the official one cannot compute (another token mixer, another
LayerNorm epsilon, non-square audio patches, Audio-JEPA's log-mel normalised by `spec_norm`) is refused,
as is one of a geometry the official classes are not built with: I-JEPA's VisionTransformer and
V-JEPA's take one `img_size` (square images and frames), and V-JEPA's builds a 2-D image model for
`num_frames` 1. Audio-JEPA's takes any (frames, mel bins) `input_size`.

The model's geometry (`geometry`) is recorded where the official loaders do not look: the
checkpoint dict's `jepa_model` key, and the safetensors metadata of that name, so that `jepa
import-checkpoint` reads the export back without options.

safetensors (the format of Hugging Face and timm): one encoder is written under its bare official
names (`blocks.0.attn.qkv.weight`, no wrapper prefix), so the official `VisionTransformer.
load_state_dict` takes the file as is; with `full`, each name is prefixed by its part (`encoder.`,
`predictor.`, `target_encoder.`). The header's metadata records the objective, step, epoch, parts
and model.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jepa_cli.errors import InputError

FORMATS = {".safetensors": "safetensors", ".pth.tar": "torch", ".pth": "torch", ".pt": "torch",
           ".ckpt": "torch"}  # .ckpt: Lightning's name for a torch.save file
PARTS = ("encoder", "predictor", "target_encoder")  # the official checkpoint's keys, in its order
MODEL_KEY = "jepa_model"  # the geometry record: a key no official loader reads


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one official codebase saves a checkpoint, and the LayerNorm epsilon of its model."""

    title: str  # the family as users know it
    repository: str
    prefix: str  # of each parameter name in the official checkpoint's state dicts
    lightning: bool  # a Lightning checkpoint (one `state_dict` of `part.name`s) rather than a dict of parts
    norm_eps: float


OFFICIAL = {  # objective -> its official layout
    # src/models/vision_transformer.py: norm_layer=partial(nn.LayerNorm, eps=1e-6); saved through DDP
    "ijepa": Layout("I-JEPA", "facebookresearch/ijepa", "module.", False, 1e-6),
    # src/models/vision_transformer.py: eps=1e-6; saved through DDP around MultiMaskWrapper
    "vjepa": Layout("V-JEPA", "facebookresearch/jepa", "module.backbone.", False, 1e-6),
    # configs/model/jepa.yaml leaves norm_layer at torch's nn.LayerNorm (eps 1e-5)
    "audio-jepa": Layout("Audio-JEPA", "LudovicTuncay/Audio-JEPA", "", True, 1e-5),
}


def format_of(path: str | os.PathLike) -> str:
    """"safetensors" or "torch", from the file name's ending; InputError for any other name."""
    name = Path(path).name.lower()
    for ending, kind in FORMATS.items():
        if name.endswith(ending) and len(name) > len(ending):
            return kind
    raise InputError(f"{path}: the format follows the file name; end it in .safetensors or .pth.tar "
                     "(also .pth, .pt, .ckpt: a PyTorch checkpoint)")


def _natural(name: str) -> list:
    """A sort key that puts blocks.2 before blocks.10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _state_dict(tree: Any, predictor: bool, width: int, grid: tuple[int, ...], family: str) -> dict[str, np.ndarray]:
    """The official state dict of one part of `family`: the convert table's tensors, plus its fixed
    position table [1, N, width] (official: a frozen nn.Parameter), names in natural order."""
    from jepa_cli.models.convert import FIXED_TABLES, to_official
    from jepa_cli.models.vit import pos_embed

    tensors = to_official(tree, predictor=predictor, family=family)
    table = FIXED_TABLES[1] if predictor else FIXED_TABLES[0]
    tensors[table] = np.asarray(pos_embed(width, grid), np.float32)[None]
    return {name: tensors[name] for name in sorted(tensors, key=_natural)}


def _check_official(run_dir: Path, name: str, objective: Any) -> Any:
    """The run's ModelConfig, or InputError when the official model of `name` could not compute it."""
    layout = OFFICIAL[name]
    model = objective.model_config
    if set(model.encoder_mixers) | set(model.predictor_mixers) != {"attn"}:
        pattern = model.mixer if set(model.encoder_mixers) != {"attn"} else model.pred_mixer
        raise InputError(f"{run_dir}: its model mixes tokens with {pattern!r}; the official model has "
                         "attention blocks only")
    if model.norm_eps != layout.norm_eps:
        raise InputError(f"{run_dir}: its LayerNorm epsilon (norm_eps) is {model.norm_eps:g}, the official "
                         f"{layout.title} model's is {layout.norm_eps:g}: the official model would not give its "
                         "features")
    spec_norm = getattr(objective.config, "spec_norm", "none")
    if spec_norm != "none":
        raise InputError(f"{run_dir}: its log-mel input is normalised (spec_norm {spec_norm!r}); the official "
                         f"{layout.title} front end does not normalise it: the official model would not give its "
                         "features")
    if getattr(objective.config, "rectangular", False):
        pt, pm = objective.config.patch_shape
        raise InputError(f"{run_dir}: its patches are {pt} frames x {pm} mel bins; the official {layout.title} "
                         "model takes square patch_size patches")
    if name in ("ijepa", "vjepa"):
        from jepa_cli.models.config import as_pair

        h, w = as_pair(model.image_size)
        if h != w:  # img_size is one side: the official pos_embed is a square grid's
            what = "images" if name == "ijepa" else "frames"
            raise InputError(f"{run_dir}: its {what} are {h}x{w} pixels (image_size); the official {layout.title} "
                             f"VisionTransformer takes square {what} (img_size is one side), so its pos_embed "
                             "would not load")
    if name == "vjepa" and model.num_frames == 1:
        raise InputError(f"{run_dir}: its clips are 1 frame (num_frames); the official {layout.title} "
                         "VisionTransformer builds an image model for num_frames 1 (a 2-D patch embedding), "
                         "which the export's tubelet weights do not load into")
    return model


def geometry(name: str, objective: Any) -> dict[str, Any]:
    """The model's geometry as the import options name it: sizes of the encoder and predictor, patch,
    input channels and the input's extent (I-JEPA and V-JEPA: `image_size`, one side, and the
    per-channel `mean` and `std`; V-JEPA also frames and tubelet; Audio-JEPA: spectrogram frames
    and mel bins)."""
    from jepa_cli.models.config import as_pair

    model, config = objective.model_config, objective.config
    out: dict[str, Any] = {"objective": name, "model": str(getattr(config, "model", model.model)),
                           "width": int(model.embed_dim), "depth": int(model.encoder_depth),
                           "heads": int(model.num_heads), "mlp_ratio": float(model.encoder_mlp_ratio),
                           "patch_size": int(model.patch_size), "channels": int(model.channels),
                           "pred_width": int(model.pred_width), "pred_depth": int(model.pred_depth),
                           "pred_heads": int(model.predictor_heads)}
    if name == "audio-jepa":  # the spectrogram's extent: square patches (_check_official), so the model's input
        frames, mel_bins = as_pair(model.image_size)
        out.update(frames=frames, mel_bins=mel_bins)
    else:  # and the input normalisation, so that the imported run encodes as this one
        out.update(image_size=int(as_pair(model.image_size)[0]), mean=[float(v) for v in config.norm_mean],
                   std=[float(v) for v in config.norm_std])
    if name == "vjepa":
        out.update(num_frames=int(model.num_frames), tubelet_size=int(model.tubelet_size))
    return out


# A LeJEPA run's one encoder is written in the layout of the JEPA that reads its modality
LEJEPA_LAYOUTS = {"image": "ijepa", "video": "vjepa", "audio": "audio-jepa"}


def _official_run(run_dir: Path, what: str) -> tuple[dict[str, Any], str]:
    """(run.json, the official layout's objective name) of RUN, refused unless its objective has an
    official layout (`what` says what the layouts are for, in the refusal); a lejepa run takes the
    layout of its modality's JEPA (LEJEPA_LAYOUTS)."""
    from jepa_cli.training.runfiles import read_run

    if not run_dir.is_dir():
        raise InputError(f"{run_dir}: no such run directory")
    record = read_run(run_dir)
    name = record["config"].get("objective")
    if name == "lejepa":
        modality = (record["config"].get("objective_config") or {}).get("modality", "image")
        return record, LEJEPA_LAYOUTS.get(modality, "ijepa")
    if name not in OFFICIAL:
        raise InputError(f"{run_dir}: a {name!r} run; {what} "
                         f"{', '.join(f'{k} ({v.repository})' for k, v in OFFICIAL.items())} and lejepa runs only")
    return record, name


def export_run(run_dir: str | os.PathLike, output: str | os.PathLike, *, step: int | None = None,
               weights: str = "target", full: bool = False,
               on_log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Writes the weights of RUN's checkpoint `step` (None: the newest that reads back) to the new
    file `output` (atomically; an existing path is refused). Returns a summary: the file, format,
    parts, step, epoch, tensor and parameter counts, bytes."""
    from jepa_cli.data.atomic import check_output_file, write_file
    from jepa_cli.models.template import first_non_finite
    from jepa_cli.training.encoder import WEIGHTS
    from jepa_cli.training.run import load_run

    kind = format_of(output)
    if weights not in WEIGHTS:
        raise InputError(f"--weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    if os.path.lexists(output):  # before loading anything
        raise InputError(f"{output}: already exists (export never replaces a file: remove it or choose another name)")
    check_output_file(output, False, b"", "checkpoint", [run_dir])  # a file inside RUN goes with its checkpoint
    run_dir = Path(run_dir)
    record, name = _official_run(run_dir, "export writes the official layout of")
    layout = OFFICIAL[name]
    log = on_log or (lambda message: None)
    config, objective, host, step = load_run(run_dir, step, on_fallback=lambda _step, message: log(message))
    model = _check_official(run_dir, name, objective)
    if objective.ema_spec is None:  # lejepa: one encoder, which is both the target and the context encoder
        if full:
            raise InputError(f"{run_dir}: a {config.get('objective')!r} run has one encoder, no predictor and no "
                             "EMA: export it without --all")
        wanted = ("target_encoder",)  # the part encode-latents --weights target reads, under the official key
        trees = {"target_encoder": host["params"]["encoder"]}
    else:
        wanted = PARTS if full else ("target_encoder" if weights == "target" else "encoder",)
        trees = {"encoder": host["params"]["encoder"], "predictor": host["params"]["predictor"],
                 "target_encoder": host["ema"]}
    for part in wanted:
        found = first_non_finite(trees[part])
        if found is not None:
            import jax

            path, bad, size = found
            raise InputError(f"{run_dir}: the {part.replace('_', ' ')} at step {step} holds {bad} non-finite "
                             f"value(s) (NaN or inf) of {size} in {jax.tree_util.keystr(path)}; nothing written")
    grid = tuple(getattr(model, "grid3d", model.grid))  # V-JEPA: (frames / tubelet, rows, columns)
    try:
        parts = {part: _state_dict(trees[part], part == "predictor",
                                   model.pred_width if part == "predictor" else model.embed_dim, grid, name)
                 for part in wanted}
    except InputError as exc:
        raise InputError(f"{run_dir}: {exc}") from None
    ipe = int((record.get("lengths") or {}).get("ipe") or 0)
    epoch = step // ipe if ipe > 0 else 0  # the official checkpoints count whole epochs

    if kind == "torch":
        from jepa_cli.models.torch_writer import torch_checkpoint_bytes

        checkpoint: dict[str, Any]
        if layout.lightning:
            checkpoint = {"epoch": epoch, "global_step": int(step),
                          "state_dict": collections.OrderedDict((f"{part}.{layout.prefix}{k}", v)
                                                                for part, tensors in parts.items()
                                                                for k, v in tensors.items())}
        else:
            checkpoint = {part: collections.OrderedDict((f"{layout.prefix}{k}", v) for k, v in tensors.items())
                          for part, tensors in parts.items()}
            checkpoint["epoch"] = epoch
        checkpoint[MODEL_KEY] = geometry(name, objective)
        data = torch_checkpoint_bytes(checkpoint)
    else:
        from safetensors.numpy import save

        flat = {(k if len(parts) == 1 else f"{part}.{k}"): v for part, tensors in parts.items()
                for k, v in tensors.items()}
        metadata = {"format": "pt", "objective": name, "layout": layout.repository, "parts": ",".join(parts),
                    "step": str(step), "epoch": str(epoch),
                    "model": json.dumps(config.get("objective_config") or {}, sort_keys=True, default=str),
                    MODEL_KEY: json.dumps(geometry(name, objective), sort_keys=True)}
        data = save(flat, metadata=metadata)
    write_file(output, data, False, b"", "checkpoint")
    return {"output": str(output), "format": kind, "run": str(run_dir), "objective": name, "parts": list(parts),
            "step": int(step), "epoch": epoch, "tensors": sum(len(t) for t in parts.values()),
            "parameters": int(sum(v.size for t in parts.values() for v in t.values())), "bytes": len(data)}


def _literal(values: Any) -> str:
    """A Python literal of floats, as the snippet writes them (repr: they read back exactly)."""
    return "[" + ", ".join(repr(float(v)) for v in values) + "]"


def snippet(run_dir: str | os.PathLike) -> str:
    """The PyTorch code that loads RUN's `jepa export` (its target encoder, the default file) into
    the official encoder class at RUN's size and runs it on an input normalised as RUN's was: the
    official imports, the constructor's arguments, a strict load and one forward pass, mean-pooled
    as `jepa encode-latents` pools. Refused as `export_run` refuses a run the official model cannot
    compute. Reads run.json only; writes nothing."""
    from jepa_cli.training.config import build_config
    from jepa_cli.training.run import make_objective

    run_dir = Path(run_dir)
    record, name = _official_run(run_dir, "the official classes are those of")
    if name == "audio-jepa" and record["config"].get("objective") == "lejepa":
        raise InputError(f"{run_dir}: a lejepa audio run reads the Kaldi log-mel of `jepa probe --raw`, not "
                         "Audio-JEPA's front end: --print-snippet writes the image and video runs' code only")
    cfg = build_config(record["config"])
    objective = make_objective(cfg.objective, cfg.objective_config)
    _check_official(run_dir, name, objective)
    g, layout, config = geometry(name, objective), OFFICIAL[name], objective.config
    checkout = layout.repository.split("/")[1]
    file = f"{run_dir.name or 'run'}.{'ckpt' if layout.lightning else 'pth.tar'}"
    head = [f"# {layout.title} encoder of {run_dir} in PyTorch, with the official code of {layout.repository}.",
            f"# Export it first:  jepa export {run_dir} -o {file}",
            f"# and run this where {checkout}/ is a checkout of {layout.repository}"
            + (" in its own environment (its package imports flash_attn and lightning)." if layout.lightning
               else "."),
            "import sys", "from functools import partial", "", "import torch", "import torch.nn as nn", "",
            f'sys.path.insert(0, "{checkout}")']
    load = [f'checkpoint = torch.load("{file}", map_location="cpu", weights_only=True)']
    if name == "ijepa":
        body = ["from src.models.vision_transformer import VisionTransformer", "",
                f"encoder = VisionTransformer(img_size=[{g['image_size']}], patch_size={g['patch_size']}, "
                f"in_chans={g['channels']}, embed_dim={g['width']}, depth={g['depth']}, num_heads={g['heads']}, "
                f"mlp_ratio={g['mlp_ratio']!r}, qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6))", *load,
                'state = {k.removeprefix("module."): v for k, v in checkpoint["target_encoder"].items()}']
        shape, what = f"2, {g['channels']}, {g['image_size']}, {g['image_size']}", "[B, C, H, W]"
    elif name == "vjepa":
        body = ["from src.models.vision_transformer import VisionTransformer", "",
                f"encoder = VisionTransformer(img_size={g['image_size']}, patch_size={g['patch_size']}, "
                f"num_frames={g['num_frames']}, tubelet_size={g['tubelet_size']}, in_chans={g['channels']}, "
                f"embed_dim={g['width']}, depth={g['depth']}, num_heads={g['heads']}, mlp_ratio={g['mlp_ratio']!r}, "
                "qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6), uniform_power=True)", *load,
                'state = {k.removeprefix("module.backbone."): v for k, v in checkpoint["target_encoder"].items()}']
        shape = f"2, {g['channels']}, {g['num_frames']}, {g['image_size']}, {g['image_size']}"
        what = "[B, C, T, H, W]"
    else:
        body = ["from src.models.components.vision_transformer import VisionTransformer", "",
                f"encoder = VisionTransformer(input_size=({g['frames']}, {g['mel_bins']}), "
                f"patch_size=({g['patch_size']}, {g['patch_size']}), in_chans=1, embed_dim={g['width']}, "
                f"depth={g['depth']}, num_heads={g['heads']}, mlp_ratio={g['mlp_ratio']!r}, qkv_bias=True, "
                "norm_layer=partial(nn.LayerNorm, eps=1e-5), use_flash_attn=False)", *load,
                'state = {k.removeprefix("target_encoder."): v for k, v in checkpoint["state_dict"].items()}']
    body += ["encoder.load_state_dict(state, strict=True)", "encoder.eval()", ""]
    if name == "audio-jepa":
        hop = config.seconds * 1000.0 / config.frames
        body += [f"# the run's input: the log-mel of {config.seconds:g} s clips at {config.sample_rate} Hz, "
                 f"{config.frames} frames (hop {hop:.2f} ms, a {config.window} window of {config.window_hops:g} hops), "
                 f"{config.mel_bins} mel bins from {config.fmin:g} to {config.fmax:g} Hz,",
                 "# not normalised: Audio-JEPA's src/data/components/mel_spec.py (kaldi.fbank) at these values",
                 f"spectrograms = torch.randn(2, 1, {config.frames}, {config.mel_bins})  # [B, 1, frames, mel bins]",
                 "with torch.no_grad():",
                 "    features = encoder(spectrograms)  # [B, tokens, width]"]
    else:
        c = g["channels"]
        mean, std = (tuple(v) * (c if len(v) == 1 else 1) for v in (config.norm_mean, config.norm_std))
        body += [f"# the run's normalisation: pixels in [0, 1] (uint8 / 255), then (x - mean) / std per channel",
                 f"mean = torch.tensor({_literal(mean)}).view(1, {c}{', 1' * (len(what.split(',')) - 2)})",
                 f"std = torch.tensor({_literal(std)}).view(1, {c}{', 1' * (len(what.split(',')) - 2)})",
                 f"pixels = torch.rand({shape})  # {what} in [0, 1], resized and centre-cropped to {g['image_size']} px",
                 "with torch.no_grad():",
                 "    features = encoder((pixels - mean) / std)  # [B, tokens, width]"]
    body += ["embedding = features.mean(dim=1)  # [B, width], mean-pooled as jepa encode-latents pools"]
    return "\n".join(head + body) + "\n"
