"""Everything the trainer checks before it writes: the dataset, the objective and the options the
dataset implies, the mesh and batch, RUN (new, resumed or replaced, on the same dataset), the step
traced on abstract values and the training-time probe. Bad input leaves RUN untouched or absent."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jepa_cli.data.urls import location
from jepa_cli.errors import InputError
from jepa_cli.training.config import TrainConfig, length_notes, resolve_lengths
from jepa_cli.training.rundir import check_outputs, check_run_dir

# make_probe(config, objective, abstract TrainState, RUN) -> probe(state) -> {metric: value}: the
# training-time probe, built by the trainer's caller (`jepa train`: evaluation.online.training_probe)
ProbeFactory = Callable[[TrainConfig, Any, Any, Path], Callable[[Any], dict[str, float]]]
# make_quality(config, objective) -> quality(encoder params) -> a device scalar, or None when off: the
# label-free figure logged as `sigreg_quality` (`jepa train`: evaluation.quality.training_quality)
QualityFactory = Callable[[TrainConfig, Any], Callable[[Any], Any] | None]


@dataclasses.dataclass
class Plan:
    """Everything train() validated before writing: what the locked part needs."""

    out: Path
    mode: str  # 'new' | 'resume' | 'force' (check_run_dir)
    objective: Any
    lengths: dict[str, int]
    mesh: Any
    tx: Any
    abstract: Any  # the TrainState of ShapeDtypeStructs
    state_sh: Any
    batch_sh: Any
    transform: Callable
    step_fn: Callable
    record: dict[str, Any]  # run.json
    probe: Callable | None = None  # the caller's probe of a TrainState when --probe-every is set
    new_data: bool = False  # resumed on another dataset (--allow-new-data): read it from its beginning
    seen: tuple[int, int, int] | None = None  # RUN's run.json as checked (run.run_identity)
    geometry: str | None = None  # geometry_warning: the dataset is not the size the model takes
    quality: Callable[[Any], Any] | None = None  # the caller's quality signal (QualityFactory), None when off


def _trace_step(step_fn: Callable, abstract: Any, state_sh: Any, batch_spec: dict[str, Any], objective: str) -> None:
    """Traces the step on abstract values (no compile, no data): checks that run at trace time
    (I-JEPA's mask options against the patch grid, shapes against the model) fail here, before RUN
    is written. jit caches the trace, so the first real step does not trace again."""
    import jax

    state_spec = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), abstract, state_sh)
    try:
        step_fn.trace(state_spec, batch_spec)
    except (TypeError, ValueError) as exc:  # an option of the wrong type (e.g. a string) met an operation
        reason = " ".join(str(exc).split())[:200]
        raise InputError(f"the {objective} options do not build a model ({type(exc).__name__}: {reason})") from None

def uses_labels(objective) -> bool:
    """Whether batches carry "label" (int32 [B]): objectives that condition on classes say so."""
    return bool(getattr(objective, "uses_labels", False))

def _dataset_options(name: str, ds: dict) -> dict:
    """Options the dataset implies: the objective class's `dataset_options(ds)` classmethod when it
    has one; else, for images, the channels and image size."""
    from jepa_cli.objectives import OBJECTIVES

    hook = getattr(OBJECTIVES.get(name), "dataset_options", None)
    if hook is not None:
        return dict(hook(ds))
    if ds["modality"] != "image":
        return {}
    return {"channels": ds["channels"],
            "image_size": ds["height"] if ds["height"] == ds["width"] else [ds["height"], ds["width"]]}

def _fill_from_dataset(name: str, objective_config: dict, ds: dict) -> dict:
    """The options the dataset implies, where the user set none and the objective takes them."""
    from jepa_cli.training.run import make_objective

    cfg = dict(objective_config)
    extra = {k: v for k, v in _dataset_options(name, ds).items() if k not in cfg}
    for key, value in extra.items():
        try:
            make_objective(name, {**cfg, key: value})
        except InputError as exc:
            if repr(key) in str(exc):  # the objective has no such option: leave it out
                continue
            raise
        cfg[key] = value
    return cfg

def _resolve_objective(config: TrainConfig, ds: dict, lengths: dict, objective=None):
    """The objective of a run, told its length; fills config.objective_config with every option the
    objective resolved (its defaults, and what the dataset implies), as run.json records it."""
    from jepa_cli.training.run import make_objective, objective_config_of

    if objective is None:
        config.objective_config = _fill_from_dataset(config.objective, config.objective_config, ds)
        objective = make_objective(config.objective, config.objective_config, lengths["ema_t_max"])
    elif hasattr(objective, "with_total_updates"):
        objective = objective.with_total_updates(lengths["ema_t_max"])
    if callable(getattr(objective, "fit_to_data", None)):  # statistics of the training set, kept in run.json
        objective = objective.fit_to_data(config.data)
    config.objective_config = objective_config_of(objective, config.objective_config)
    return objective

def _hxw(size) -> tuple[int, int]:
    return (int(size[0]), int(size[1])) if isinstance(size, (list, tuple)) else (int(size), int(size))


def geometry_warning(name: str, objective_config: dict, ds: dict) -> str | None:
    """Why the dataset is not what the model takes (a sentence naming both geometries and the option
    to set), or None: the frame size of images and clips (image_size) and the length and rate of
    audio clips (seconds, sample_rate), where the recipe or the command line set the model's to
    something other than the dataset's, so that the input pipeline resizes, crops or pads every
    sample. A warning, not a refusal: a resize can be meant. Images stored at the size the
    evaluation resize gives (image_size x eval_resize_ratio, the official 256 for crops of 224)
    are what the model takes too."""
    implied = _dataset_options(name, ds)
    if "image_size" in implied and objective_config.get("image_size") is not None:
        (h, w), (mh, mw) = _hxw(implied["image_size"]), _hxw(objective_config["image_size"])
        stored = max(int(mh * float(objective_config.get("eval_resize_ratio", 1.0))), mh, mw)
        if (h, w) != (mh, mw) and min(h, w) != stored:
            what = "frames" if ds["modality"] == "video" else "images"
            return (f"the dataset holds {h}x{w} {what}, the model takes {mh}x{mw} (image_size): every sample is "
                    f"resized to {mh}x{mw}; pass --image-size {h}x{w} to train at the dataset's size, or ingest "
                    f"with --size {mh}x{mw}")
    if "seconds" in implied:
        rate, seconds = implied["sample_rate"], implied["seconds"]
        model_rate = int(objective_config.get("sample_rate") or rate)
        model_seconds = float(objective_config.get("seconds") or seconds)
        if model_rate != rate or abs(model_seconds - seconds) > 0.5 / rate:
            return (f"the dataset holds {seconds:g} s clips at {rate} Hz, the model takes {model_seconds:g} s at "
                    f"{model_rate} Hz (seconds, sample_rate): every clip is cropped or padded to "
                    f"{round(model_seconds * model_rate)} samples; set seconds and sample_rate in the recipe to the "
                    f"dataset's, or ingest with --seconds {model_seconds:g} --sample-rate {model_rate}")
    return None


def resolved_config(config: TrainConfig) -> tuple[TrainConfig, dict[str | None, dict[str, str]]]:
    """The configuration run.json would record for `config` (`jepa train --print-config`), the
    objective's options completed from its defaults and the dataset, and notes for config.to_toml:
    the trainer's (length_notes) and the objective class's `config_notes(table)` hook when it has one.
    Reads the dataset's metadata; writes nothing and builds no model."""
    from jepa_cli.objectives import OBJECTIVES
    from jepa_cli.data.trainable import check_dataset

    if not config.data:
        raise InputError("--data is required (the dataset fills in the image size and channels)")
    config = dataclasses.replace(config, objective_config=dict(config.objective_config))
    ds = check_dataset(config.data)
    lengths = resolve_lengths(config, ds["num_samples"])
    _resolve_objective(config, ds, lengths)
    # total_updates is recomputed from the run's length (as on --resume), so an edited length stays consistent
    config.objective_config.pop("total_updates", None)
    objective_notes = getattr(OBJECTIVES.get(config.objective), "config_notes", None)
    notes = {None: length_notes(lengths),
             config.objective: objective_notes(config.objective_config) if objective_notes else {}}
    return config, notes


def make_plan(config: TrainConfig, objective, resume: bool, force: bool, allow_new_data: bool = False,
              make_probe: ProbeFactory | None = None, make_quality: QualityFactory | None = None) -> Plan:
    """Validates everything (dataset, objective, mesh, batch, RUN, the traced step, the probe built by
    `make_probe`, the quality signal built by `make_quality`, which reads its examples); writes nothing."""
    import jax

    from jepa_cli.data.files import check_regular
    from jepa_cli.data.trainable import check_dataset, check_modality
    from jepa_cli.training import mesh as mesh_lib
    from jepa_cli.training.data import abstract_batch
    from jepa_cli.training.import_official import check_resumable
    from jepa_cli.training.run import abstract_state, build_optimizer, require_tensorboard, require_wandb
    from jepa_cli.training.runfiles import METRICS_FILE, RUN_FILE, read_run, run_identity
    from jepa_cli.training.step import jit_step, make_step_fn

    if config.tensorboard:
        require_tensorboard()  # a missing extra is refused before any work, and before anything is written
    if config.wandb:
        require_wandb()
    if not config.data:
        raise InputError("--data is required")
    if not config.out:
        raise InputError("--out is required")
    check_run_location(config.out)
    location(config.data)  # a malformed or unsupported URL is refused before any work
    out = Path(config.out)
    if resume and (out / RUN_FILE).is_file():  # an encoder-only run has nothing to resume, whatever else is asked
        check_resumable(read_run(out), out)
    ds = check_dataset(config.data)
    check_outputs(config)
    lengths = resolve_lengths(config, ds["num_samples"])
    objective = _resolve_objective(config, ds, lengths, objective)
    check_modality(config.data, ds, objective, config.objective)
    geometry = geometry_warning(config.objective, config.objective_config, ds)
    ds_channels = config.objective_config.get("channels")
    if ds["modality"] == "image" and ds_channels is not None and int(ds_channels) != ds["channels"]:
        raise InputError(f"{config.data}: images have {ds['channels']} channels, the model expects {ds_channels}")
    mesh = mesh_lib.make_mesh(config.mesh)
    mesh_lib.check_batch(config.batch_size, mesh, config.grad_accum)
    mode = check_run_dir(out, resume, force)
    seen = run_identity(out)
    dataset = {**{k: v for k, v in ds.items() if k != "attrs"}, **_dataset_identity(config.data)}
    new_data = False
    if mode == "resume":
        stored_record = read_run(out)
        check_regular(out / METRICS_FILE)  # before anything in RUN is written: it is cut back at the start
        stored = stored_record.get("config", {})
        if stored.get("objective") != config.objective:
            raise InputError(f"{out}: holds a {stored.get('objective')!r} run, not {config.objective!r}")
        new_data = _check_same_dataset(out, stored_record, config.data, dataset, allow_new_data)

    abstract_params = jax.eval_shape(objective.init, jax.ShapeDtypeStruct((2,), np.uint32))
    tx, lr_fn, wd_fn, momentum_fn = build_optimizer(config, objective, lengths, abstract_params)
    abstract = abstract_state(objective, tx, abstract_params)
    state_sh = mesh_lib.state_shardings(mesh, abstract)
    batch_sh = mesh_lib.batch_sharding(mesh)
    transform, on_device = _train_transform(config, objective)
    step_fn = jit_step(make_step_fn(objective, tx, lr_fn, wd_fn, momentum_fn, config.grad_accum, on_device),
                       state_sh, batch_sh, mesh_lib.replicated(mesh))
    batch_spec = abstract_batch(config.data, transform, config.batch_size, batch_sh, uses_labels(objective))
    _trace_step(step_fn, abstract, state_sh, batch_spec, config.objective)
    probe = _probe(config, make_probe, objective, abstract, out)
    record = {"jepa_kind": "run", "config": config.to_dict(), "lengths": lengths, "dataset": dataset,
              "status": "running"}
    return Plan(out=out, mode=mode, objective=objective, lengths=lengths, mesh=mesh, tx=tx, abstract=abstract,
                 state_sh=state_sh, batch_sh=batch_sh, transform=transform, step_fn=step_fn, record=record,
                 probe=probe, new_data=new_data, seen=seen, geometry=geometry,
                 quality=make_quality(config, objective) if make_quality else None)


def _train_transform(config: TrainConfig, objective) -> tuple[Callable, Callable | None]:
    """The objective's training transform and the part of it the step applies on the device (None:
    all of it runs in the input pipeline); an InputError when `device_normalise` asks for a part
    that the objective's inputs do not have."""
    size = config.objective_config.get("image_size")
    if not config.device_normalise:
        return objective.train_transform(size), None
    transform = objective.train_transform(size, on_device=True)
    on_device = getattr(transform, "device", None)
    if on_device is None:
        raise InputError(f"--device-normalise: {config.objective}'s inputs are not pixels to normalise on the "
                         f"device (ijepa and vjepa take it)")
    return transform, on_device


def check_run_location(out: str) -> None:
    """InputError (one line) for a run location that is a malformed URL or has an unsupported scheme; a
    local folder, s3://BUCKET/RUN and gs://BUCKET/RUN are runs (a bucket run: training/bucket_run.py)."""
    location(out)


def _dataset_identity(path: str) -> dict[str, str]:
    """What run.json records to know its dataset again on --resume: the absolute path and
    `store.dataset_fingerprint` (the metadata, and each chunk file's name, size and mtime)."""
    from jepa_cli.data import store

    from jepa_cli.data.urls import location

    return {"path": str(location(path).resolve()), "fingerprint": store.dataset_fingerprint(path)}

SUMMARY_KEYS = ("num_samples", "modality", "shape", "dtype")  # what a dataset holds, as run.json records it

def _check_same_dataset(out: Path, stored_record: dict[str, Any], given: str, dataset: dict[str, Any],
                        allow_new_data: bool) -> bool:
    """Whether a resumed run continues on a dataset other than the one it was started on (only with
    `allow_new_data`; else an InputError naming both). The same dataset: the same fingerprint
    (wherever it was moved), or the same path holding as many samples of the same shape and dtype.
    A run that recorded no dataset (an imported one) takes any."""
    recorded = stored_record.get("dataset")
    started_on = (stored_record.get("config") or {}).get("data")
    if not isinstance(recorded, dict) or not started_on:
        return False
    if recorded.get("fingerprint") is not None and recorded["fingerprint"] == dataset["fingerprint"]:
        return False
    started = recorded.get("path") or str(Path(started_on).resolve())  # runs that recorded no path: as given
    if started == dataset["path"]:
        changed = [k for k in SUMMARY_KEYS if k in recorded and recorded[k] != dataset.get(k)]
        if not changed:
            return False
        why = "it changed since: " + ", ".join(f"{k} {recorded[k]} -> {dataset.get(k)}" for k in changed)
    else:
        why = "another dataset"
    if allow_new_data:
        return True
    raise InputError(f"{out}: was started on the dataset {started}, not {given} ({why}); a resumed run keeps "
                     f"its dataset: pass --allow-new-data to continue it on {given}, read from its beginning")


def _probe(config: TrainConfig, make_probe: ProbeFactory | None, objective, abstract, out: Path) -> Callable | None:
    """The training-time probe (None without --probe-every), built by the caller's `make_probe` once
    the probe options are checked."""
    import jax

    if config.probe_every is None:
        if config.probe_data:
            raise InputError("--probe-data needs --probe-every N")
        return None
    if not config.probe_data:
        raise InputError("--probe-every needs --probe-data TRAIN.zarr,TEST.zarr")
    if jax.process_count() > 1:
        raise InputError("--probe-every runs in single-process training only (probe the checkpoints with "
                         "`jepa encode-latents` and `jepa probe knn` instead)")
    if make_probe is None:
        raise InputError("--probe-every: this caller of the trainer passes no probe (`jepa train` does)")
    return make_probe(config, objective, abstract, out)
