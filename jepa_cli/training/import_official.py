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
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import jax
import numpy as np

from jepa_cli.data.atomic import atomic_directory
from jepa_cli.errors import InputError, JepaError, storage_failure
from jepa_cli.models.convert import from_official
from jepa_cli.training.abandoned_reads import silence_abandoned_reads
from jepa_cli.training.checkpoint import Checkpoints
from jepa_cli.training.digest import DIGEST_FILE, digest_problem, sha256_of
from jepa_cli.training.config import build_config, load_toml, merge, resolve_lengths
from jepa_cli.training.official_model import check_positions, check_shapes, model_config
from jepa_cli.training.official_read import (FAMILIES, PARTS, Family, check_finite, detect_family, official_parts,
                                             read_checkpoint, recorded_model)
from jepa_cli.training.run import build_optimizer, make_objective, objective_config_of
from jepa_cli.training.runfiles import write_run
from jepa_cli.training.state import TrainState

MAX_STEP = 2**31 - 1  # TrainState.step is int32


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


def check_resumable(record: Mapping[str, Any], run: str | Path) -> None:
    """InputError for `train --resume` of an encoder-only run (imported from a file of one encoder)."""
    imported = record.get("imported")
    parts = imported.get("parts") if isinstance(imported, Mapping) else None
    if isinstance(parts, list) and "predictor" not in parts:
        raise InputError(f"{run}: an encoder-only run (imported from {imported.get('source')}, which holds the "
                         f"{' and '.join(str(p).replace('_', ' ') for p in parts)} alone): it holds no predictor "
                         "and no optimizer state to resume; it encodes and probes, and `jepa train` starts a new run")


def _check_written(step_dir: Path, out: str | Path) -> None:
    """The checkpoint just written has its digest and its files match it (a disk that lost or changed
    bytes on the way is caught before the run is moved into place)."""
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
    source = Path(source)
    if os.path.lexists(out):  # before reading anything
        raise InputError(f"{out}: already exists (import-checkpoint never replaces a path: remove it or choose "
                         "another name)")
    # shapes first (no tensor read): the family, the model and every shape are checked before the bytes
    layout = read_checkpoint(source, keys=(), objective=objective)
    detected = _family(layout, source, objective)
    family = FAMILIES[detected]
    shapes, present, converted = _checked_shapes(layout, source, detected)
    model = model_config(detected, shapes, recorded_model(layout, source, detected), options.objective_config,
                         options.defaults, source)
    step, epoch, ipe = _step(layout, family, options, source)
    cfg, lengths, table = _train_config(family, options, ipe, out)
    # the imported weights are float32 and so is their compute: features as the official float32 model's
    config = {**table, **model, "dtype": "float32"} if detected != "ijepa" else model
    objective_ = make_objective(family.objective, config, lengths["ema_t_max"])
    cfg.objective_config = objective_config_of(objective_, config)
    want = objective_.param_shapes()
    for part in present:
        check_shapes(converted[part], want["predictor" if part == "predictor" else "encoder"], source,
                     part.replace("_", " "))
    check_positions(shapes, objective_.model_config, source, detected)
    params, target = _weights(source, detected, present, want)
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
    _write_run(out, source, record, state, step, log)
    count = lambda tree: int(sum(np.size(v) for v in jax.tree.leaves(tree)))  # noqa: E731
    return {"run": str(out), "objective": detected, "step": step, "epoch": epoch, "source": str(source),
            "sha256": digest, "encoder_params": count(params["encoder"]),
            "predictor_params": count(params["predictor"])}


def _family(layout: Any, source: Path, objective: str | None) -> str:
    """The family the file is (detect_family); InputError when `objective` names another."""
    detected = detect_family(layout, source)
    if objective is not None and objective != detected:
        raise InputError(f"{source}: an {FAMILIES[detected].title} checkpoint, not an {FAMILIES[objective].title} "
                         f"one (use --objective {detected}, or leave --objective out)")
    return detected


def _checked_shapes(layout: Any, source: Path, family: str) -> tuple[dict[str, dict[str, np.ndarray]],
                                                                     tuple[str, ...], dict[str, Any]]:
    """Zero-stride stand-ins of each tensor's shape per part, the parts present (all three, or the one
    encoder of a one-encoder file) and each part converted to our names (without allocating a
    tensor). Every name is checked against the official model's before its size is read from them."""
    shapes = {k: {name: np.broadcast_to(np.float32(0), ref.shape) for name, ref in part.items()}
              for k, part in official_parts(layout, source, family).items()}
    present = tuple(k for k in PARTS if k in shapes)
    try:
        converted = {k: from_official(shapes[k], predictor=k == "predictor", family=family) for k in present}
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None
    return shapes, present, converted


def _weights(source: Path, family: str, present: tuple[str, ...], want: Any) -> tuple[Any, Any]:
    """(params, EMA) read from the file at the dtypes of `want`: the context encoder and predictor,
    and the target encoder; of a one-encoder file, that encoder as both and a predictor of zeros."""
    checkpoint = read_checkpoint(source, keys=("state_dict",) if family == "audio-jepa" else present,
                                 objective=family, inert=family == "audio-jepa")
    parts = official_parts(checkpoint, source, family)
    check_finite(parts, source)
    if len(present) == 1:  # an encoder-only run: the one encoder is both, the predictor zeros
        encoder = from_official(parts[present[0]], family=family)
        params = {"encoder": encoder, "predictor": jax.tree.map(lambda w: np.zeros(w.shape, w.dtype),
                                                                want["predictor"])}
        target = encoder
    else:
        params = {"encoder": from_official(parts["encoder"], family=family),
                  "predictor": from_official(parts["predictor"], predictor=True, family=family)}
        target = from_official(parts["target_encoder"], family=family)
    params = jax.tree.map(lambda v, w: np.asarray(v, w.dtype), params, want)
    target = jax.tree.map(lambda v, w: np.asarray(v, w.dtype), target, want["encoder"])
    return params, target


def _write_run(out: str | Path, source: Path, record: dict[str, Any], state: Any, step: int,
               log: Callable[[str], None] | None) -> None:
    """Writes the run `out` (run.json `record`, the checkpoint of `state` at `step`) atomically, its
    checkpoint read back against its digest; a disk that fails is one InputError, nothing written."""
    # A failed write (a full disk) leaves orbax's other writes in flight, each printing a traceback
    # from its thread: dropped, the error's one line says it all
    silence_abandoned_reads()
    try:
        with atomic_directory(out, force=False, kind="run", inputs=[source], log=log) as tmp:
            record["config"]["out"] = str(out)
            with _settled_on_failure(tmp):
                ckpts = Checkpoints(tmp, keep=None, async_save=False)
                try:
                    ckpts.save(step, state.as_dict(), {}, {**record["config"], "lengths": record["lengths"]})
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
