"""The training loop: train(config, objective, callbacks) -> summary.

Validates everything (dataset, objective options, mesh, batch, an existing RUN, and the step itself,
traced once on abstract values so that trace-time checks such as the mask options run) before
writing anything, so bad input leaves RUN untouched or, for a new run, absent. While it trains,
process 0 holds RUN's lock (run.RunLock): a second trainer on the same RUN is refused. SIGINT/SIGTERM
finish the current step, save and return (a second signal stops at once); a non-finite loss or
gradient stops the run with the last good checkpoint kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jepa_cli.errors import InputError, JepaError, Terminated, storage_failure
from jepa_cli.training.config import TrainConfig, resolve_lengths, warmup_warning
from jepa_cli.training.run import METRICS_FILE, RUN_FILE, MetricsWriter


class TrainingDiverged(JepaError):
    """A non-finite loss or gradient (exit code 1)."""


def _noop(*_a, **_k):
    return None


@dataclasses.dataclass
class Callbacks:
    """Hooks for the caller (the CLI draws progress with them); all optional, called on process 0."""

    on_start: Callable[[dict], None] = _noop  # {"run", "start_step", "steps", "mesh", "devices", ...}
    on_step: Callable[[dict], None] = _noop  # host metrics of every step
    on_log: Callable[[str], None] = _noop  # a message worth showing (warnings, checkpoints)
    on_warning: Callable[[str], None] = _noop  # a `jepa: warning:` line: the run goes on, but not as the user meant
    on_checkpoint: Callable[[int], None] = _noop
    after_step: Callable[[int], None] = _noop  # after step N is done (tests use it to send signals)


def _check_run_dir(out: Path, resume: bool, force: bool) -> str:
    """'new', 'resume' or 'force'; refuses to write into an existing RUN otherwise.

    A run with no complete checkpoint (stopped by a crash or an error before its first save) holds
    nothing to resume or to lose: it is 'new' and is overwritten without --force."""
    from jepa_cli.training.run import LOCK_FILE, checkpoint_steps

    if not out.exists():
        if not out.parent.exists():
            raise InputError(f"{out.parent}: output directory does not exist")
        return "new"
    if not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory")
    if not any(p.name != LOCK_FILE for p in out.iterdir()):
        return "new"
    if not (out / RUN_FILE).exists():
        raise InputError(f"{out}: exists and is not a training run (refusing to write into it)")
    if not checkpoint_steps(out):
        return "new"
    if resume:
        return "resume"
    if force:
        return "force"
    raise InputError(f"{out}: already holds a run (use --resume to continue it or --force to replace it)")


def _check_outputs(config: TrainConfig) -> None:
    """RUN and the --tensorboard folder may not be, contain or lie inside an input (the dataset, the
    --probe-data sets): a --force would delete the dataset's files, event files would mix into it. An
    existing --tensorboard that is not a folder is refused here, before RUN is created."""
    from jepa_cli.data import atomic

    inputs = [config.data]
    if config.probe_data:
        inputs += [p.strip() for p in config.probe_data.split(",") if p.strip()]
    atomic.check_disjoint(config.out, inputs)
    if config.tensorboard:
        atomic.check_disjoint(config.tensorboard, inputs)
        board = Path(config.tensorboard)
        try:
            os.stat(board)  # a name too long, a file as a folder on the way: an OSError the CLI reports in one line
        except FileNotFoundError:  # created at the first row; its nearest existing folder must take it
            folder = next(p for p in board.absolute().parents if p.exists())
            if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
                raise InputError(f"{board}: cannot create the --tensorboard folder in {folder} "
                                 "(not a writable folder)") from None
        else:
            if not board.is_dir():
                raise InputError(f"{board}: --tensorboard names a file, not a folder; choose a folder for the "
                                 "event files")


RUN_MODES = ("new", "resume", "force")  # what _check_run_dir finds


def _lock_run(out: Path, main: bool, planned: str, resume: bool, force: bool) -> tuple[Any, str]:
    """Process 0 creates RUN if needed, locks it (run.RunLock) and, holding the lock, checks RUN
    again (`_check_run_dir`: another trainer may have written it since `_plan` looked, as `planned`).
    Returns (the lock, or None on the other processes, the mode). The other processes never write,
    lock or look: they learn process 0's mode, or that it stopped, from one broadcast. (Each process
    looking for itself raced: a process that looked after process 0 had written run.json refused the
    run while process 0 waited for it in orbax's first barrier, forever.)"""
    import jax

    from jepa_cli.training.run import RunLock

    lock, error, mode = None, None, planned
    if main:
        try:
            out.mkdir(exist_ok=True)
            lock = RunLock(out)
            lock.acquire()
            mode = _check_run_dir(out, resume, force)
            if mode != planned and mode != "new":
                raise InputError(f"{out}: another process wrote a run here meanwhile; check it, then rerun")
        except InputError as exc:
            error = exc
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        code = int(multihost_utils.broadcast_one_to_all(np.int32(-1 if error else RUN_MODES.index(mode))))
        if code < 0 and error is None:
            error = InputError(f"{out}: process 0 could not lock or check the run (see its error)")
        mode = RUN_MODES[max(code, 0)]
    if error is not None:
        if lock is not None:
            lock.release()
        raise error
    return lock, mode


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


def _uses_labels(objective) -> bool:
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


def _jsonable_metrics(m: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in m.items():
        if isinstance(v, (np.generic, np.ndarray)):
            v = v.item() if np.ndim(v) == 0 else np.asarray(v).tolist()
        if isinstance(v, float) and not math.isfinite(v):
            v = None
        out[k] = v
    return out


class _StopFlag:
    def __init__(self):
        self.signal: str | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.signal is not None:  # a second signal: stop now, without waiting for the save
            raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt
        self.signal = signal.Signals(signum).name

    def agreed(self) -> str | None:
        """The signal to stop on at this step, the same in every process: with several processes, a
        signal that reached any of them (they save together, so they must stop at the same step).
        One tiny host all-gather per step, only in multi-process runs."""
        import jax

        if jax.process_count() == 1:
            return self.signal
        from jax.experimental import multihost_utils

        names = ("SIGINT", "SIGTERM")
        mine = np.int32(names.index(self.signal) + 1 if self.signal in names else 0)
        code = int(np.max(multihost_utils.process_allgather(mine)))
        return names[code - 1] if code else None

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


@dataclasses.dataclass
class _Plan:
    """Everything train() validated before writing: what the locked part needs."""

    out: Path
    mode: str  # 'new' | 'resume' | 'force' (_check_run_dir)
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
    probe: Callable | None = None  # evaluation.online.OnlineProbe when --probe-every is set
    new_data: bool = False  # resumed on another dataset (--allow-new-data): read it from its beginning


def run_probe(probe: Callable, objective, state, out: Path) -> dict[str, float]:
    """The training-time probe's scores on `state`'s target encoder, and the seconds it took."""
    start = time.perf_counter()
    scores = probe(_probed_encoder(objective, state, out))
    return {**scores, "probe_seconds": time.perf_counter() - start}


def collapse_sign(metrics: dict[str, Any], config, rank_peak: float | None = None) -> str | None:
    """Why one update's metrics look like a collapse (a sentence), or None. Constant features:
    `repr_std` (context) or `target_std` below `collapse_threshold`. Dimensional collapse:
    `effective_rank` of the target features (the trainer passes its average over about the last
    20 updates) fallen below `collapse_rank_fraction` of `rank_peak`, the highest that average
    reached earlier in this run; relative, because a randomly initialised ViT's
    mean-pooled features already span only about 2 dimensions. Tested on batches of 5 or more
    (a batch of B spans at most B - 1 dimensions)."""
    for key in ("repr_std", "target_std"):
        value = metrics.get(key)
        if value is not None and float(value) < config.collapse_threshold:
            return (f"{key} {float(value):.3g} < {config.collapse_threshold:g}: the encoder looks collapsed "
                    "(constant representations)")
    rank = metrics.get("effective_rank")
    if rank is None or rank_peak is None or config.batch_size // config.grad_accum < 5:
        return None
    if float(rank) < config.collapse_rank_fraction * rank_peak:
        return (f"effective_rank {float(rank):.3g} fell below {config.collapse_rank_fraction:g} x its peak "
                f"{rank_peak:.3g}: the target features span fewer and fewer dimensions (a dimensional collapse)")
    return None


def train(config: TrainConfig, objective=None, callbacks: Callbacks | None = None, resume: bool = False,
          force: bool = False, allow_new_data: bool = False) -> dict[str, Any]:
    """Trains `objective` (built from config.objective when None) as `config` says; returns a summary.
    A resumed run keeps the dataset it was started on; `allow_new_data` lets it continue on another
    one (`_check_same_dataset`)."""
    import jax

    cb = callbacks or Callbacks()
    main = jax.process_index() == 0
    if not main:
        cb = Callbacks()
    plan = _plan(config, objective, resume, force, allow_new_data)
    created = main and not plan.out.exists()
    lock, mode = _lock_run(plan.out, main, plan.mode, resume, force)
    try:
        return _train_locked(config, plan, mode, cb, main)
    finally:
        if lock is not None:
            lock.release()
        if created and plan.out.is_dir() and not any(plan.out.iterdir()):
            plan.out.rmdir()  # failed before writing anything: leave no trace


def _resolve_objective(config: TrainConfig, ds: dict, lengths: dict, objective=None):
    """The objective of a run, told its length; fills config.objective_config with every option the
    objective resolved (its defaults, and what the dataset implies), as run.json records it."""
    from jepa_cli.training.run import make_objective, objective_config_of

    if objective is None:
        config.objective_config = _fill_from_dataset(config.objective, config.objective_config, ds)
        objective = make_objective(config.objective, config.objective_config, lengths["ema_t_max"])
    elif hasattr(objective, "with_total_updates"):
        objective = objective.with_total_updates(lengths["ema_t_max"])
    config.objective_config = objective_config_of(objective, config.objective_config)
    return objective


def resolved_config(config: TrainConfig) -> TrainConfig:
    """The configuration run.json would record for `config` (`jepa train --print-config`): the
    objective's options completed from its defaults and the dataset. Reads the dataset's metadata;
    writes nothing and builds no model."""
    from jepa_cli.training.data import check_dataset

    if not config.data:
        raise InputError("--data is required (the dataset fills in the image size and channels)")
    config = dataclasses.replace(config, objective_config=dict(config.objective_config))
    ds = check_dataset(config.data)
    _resolve_objective(config, ds, resolve_lengths(config, ds["num_samples"]))
    # total_updates is recomputed from the run's length (as on --resume), so an edited length stays consistent
    config.objective_config.pop("total_updates", None)
    return config


def _plan(config: TrainConfig, objective, resume: bool, force: bool, allow_new_data: bool = False) -> _Plan:
    """Validates everything (dataset, objective, mesh, batch, RUN, the traced step); writes nothing."""
    import jax

    from jepa_cli.training import mesh as mesh_lib
    from jepa_cli.training.data import abstract_batch, check_dataset, check_modality
    from jepa_cli.training.run import abstract_state, build_optimizer, read_run, require_tensorboard, require_wandb
    from jepa_cli.training.step import jit_step, make_step_fn

    if config.tensorboard:
        require_tensorboard()  # a missing extra is refused before any work, and before anything is written
    if config.wandb:
        require_wandb()
    if not config.data:
        raise InputError("--data is required")
    if not config.out:
        raise InputError("--out is required")
    for option, path in (("--data", config.data), ("--out", config.out)):
        if "://" in path:  # Path() would quietly make a local folder named gs:
            raise InputError(f"{option} {path}: URLs are not supported; mount the bucket and give its local path "
                             "(docs/distributed.md)")
    out = Path(config.out)
    ds = check_dataset(config.data)
    _check_outputs(config)
    lengths = resolve_lengths(config, ds["num_samples"])
    objective = _resolve_objective(config, ds, lengths, objective)
    check_modality(config.data, ds, objective, config.objective)
    ds_channels = config.objective_config.get("channels")
    if ds["modality"] == "image" and ds_channels is not None and int(ds_channels) != ds["channels"]:
        raise InputError(f"{config.data}: images have {ds['channels']} channels, the model expects {ds_channels}")
    mesh = mesh_lib.make_mesh(config.mesh)
    mesh_lib.check_batch(config.batch_size, mesh, config.grad_accum)
    mode = _check_run_dir(out, resume, force)
    dataset = {**{k: v for k, v in ds.items() if k != "attrs"}, **_dataset_identity(config.data)}
    new_data = False
    if mode == "resume":
        stored_record = read_run(out)
        stored = stored_record.get("config", {})
        if stored.get("objective") != config.objective:
            raise InputError(f"{out}: holds a {stored.get('objective')!r} run, not {config.objective!r}")
        new_data = _check_same_dataset(out, stored_record, config.data, dataset, allow_new_data)

    abstract_params = jax.eval_shape(objective.init, jax.ShapeDtypeStruct((2,), np.uint32))
    tx, lr_fn, wd_fn, momentum_fn = build_optimizer(config, objective, lengths, abstract_params)
    abstract = abstract_state(objective, tx, abstract_params)
    state_sh = mesh_lib.state_shardings(mesh, abstract)
    batch_sh = mesh_lib.batch_sharding(mesh)
    transform = objective.train_transform(config.objective_config.get("image_size"))
    step_fn = jit_step(make_step_fn(objective, tx, lr_fn, wd_fn, momentum_fn, config.grad_accum),
                       state_sh, batch_sh, mesh_lib.replicated(mesh))
    batch_spec = abstract_batch(config.data, transform, config.batch_size, batch_sh, _uses_labels(objective))
    _trace_step(step_fn, abstract, state_sh, batch_spec, config.objective)
    probe = _make_probe(config, objective, abstract, out)
    record = {"jepa_kind": "run", "config": config.to_dict(), "lengths": lengths, "dataset": dataset,
              "status": "running"}
    return _Plan(out=out, mode=mode, objective=objective, lengths=lengths, mesh=mesh, tx=tx, abstract=abstract,
                 state_sh=state_sh, batch_sh=batch_sh, transform=transform, step_fn=step_fn, record=record,
                 probe=probe, new_data=new_data)


def _dataset_identity(path: str) -> dict[str, str]:
    """What run.json records to know its dataset again on --resume: the absolute path and
    `store.dataset_fingerprint` (the metadata, and each chunk file's name, size and mtime)."""
    from jepa_cli.data import store

    return {"path": str(Path(path).resolve()), "fingerprint": store.dataset_fingerprint(path)}


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


def _make_probe(config: TrainConfig, objective, abstract, out: Path):
    """The training-time k-NN probe of the target encoder (None without --probe-every), its data
    read and the encoder traced on it before anything is written."""
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
    from jepa_cli.evaluation.online import OnlineProbe, parse_probe_data

    probe = OnlineProbe(objective, *parse_probe_data(config.probe_data), config.probe_k,
                        config.objective_config.get("image_size"), config.objective_config.get("channels"))
    probe.check(_probed_encoder(objective, abstract, out))
    return probe


def _probed_encoder(objective, state, out: Path):
    """The parameters the training-time probe encodes with: the target (EMA) encoder, as I-JEPA evaluates."""
    from jepa_cli.evaluation.encode import select_encoder

    return select_encoder(objective, {"params": state.params, "ema": state.ema}, "target", out)


def _restore(plan: _Plan, config: TrainConfig, cb: Callbacks, main: bool):
    """(Checkpoints, state, data_state, start_step) of a resumed run, from its newest checkpoint that
    reads back. Damaged newer ones are reported (on_log) and moved aside by process 0, so that
    training can save those steps again."""
    import jax

    from jepa_cli.training.checkpoint import Checkpoints, UnreadableCheckpoint
    from jepa_cli.training.state import TrainState

    ckpts = Checkpoints(plan.out, keep=config.keep, async_save=config.async_checkpointing, create=False)
    target = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          plan.abstract.as_dict(), plan.state_sh.as_dict())
    damaged: list[int] = []

    def fallback(step: int, message: str) -> None:
        damaged.append(step)
        cb.on_log(message)

    try:
        step, restored, data_state, _ = ckpts.restore_newest(target, fallback)  # InputError on another model
    except UnreadableCheckpoint as exc:
        ckpts.close()
        raise InputError(f"{exc} (--force starts the run over)") from None
    except BaseException:
        ckpts.close()
        raise
    if main:
        for bad in damaged:
            cb.on_log(f"moved the unreadable checkpoint {bad} to {ckpts.set_aside(bad)}")
    elif damaged:
        ckpts.manager.reload()
    return ckpts, TrainState.from_dict(restored), data_state, int(step)


@dataclasses.dataclass
class _Held:
    """What a trainer holds while it writes RUN, for the cleanup after the file system refused a write."""

    ckpts: Any = None  # the open checkpoint manager (checkpoint.Checkpoints)
    step: int = 0  # updates applied so far
    saving: list[int] = dataclasses.field(default_factory=list)  # steps whose save was started


def _train_locked(config: TrainConfig, plan: _Plan, mode: str, cb: Callbacks, main: bool) -> dict[str, Any]:
    """The part of train() that runs holding RUN's lock: restore (`mode` "resume") or clear RUN, then train.
    A write the file system refuses (a full disk, ...) stops the run in one InputError (`_storage_stop`)."""
    out, lengths = plan.out, plan.lengths
    ckpts = None
    state = None
    data_state: dict[str, Any] = {}
    start_step = 0
    if mode == "resume":
        ckpts, state, data_state, start_step = _restore(plan, config, cb, main)
        if plan.new_data:  # the saved position is one in the dataset the run was started on
            data_state = {}
            cb.on_log(f"continuing {out} on the dataset {config.data} (--allow-new-data), from its beginning")
    if lengths["steps"] < start_step:
        ckpts.close()
        raise InputError(f"{out}: already at step {start_step}, past --steps {lengths['steps']}")
    held = _Held(ckpts=ckpts, step=start_step)
    try:
        return _train_written(config, plan, mode, cb, main, held, state, data_state)
    except Exception as exc:
        failure = storage_failure(exc, out)
        if failure is None:
            raise
        raise _storage_stop(plan, held, failure, main) from None


def _storage_stop(plan: _Plan, held: _Held, failure: str, main: bool) -> InputError:
    """After the file system refused a write (`failure`, one line naming the path): closes the
    checkpoint manager, removes the checkpoints this trainer left half-written (which also frees the
    room run.json needs), marks run.json `failed at step N` with the error, and returns the error to
    raise, naming the last good checkpoint. Complete checkpoints are never touched: --resume continues."""
    from jepa_cli.training.checkpoint import settle_abandoned_reads_at_exit
    from jepa_cli.training.run import checkpoint_steps, write_run

    settle_abandoned_reads_at_exit()
    if held.ckpts is not None:
        with contextlib.suppress(Exception):
            held.ckpts.close()
        with contextlib.suppress(Exception):
            held.ckpts.manager.close()  # when close() stopped at the failed write it waited for
    out = plan.out
    # orbax names a file inside the temporary folder of the step it wrote, removed below: name the step
    partial = re.match(re.escape(str((out / "checkpoints").resolve())) + r"/(\d+)\.orbax-checkpoint-tmp[^:]*: (.*)",
                       failure)
    if partial:
        failure = f"{out / 'checkpoints' / partial.group(1)}: {partial.group(2)}"
    complete = checkpoint_steps(out)
    if main:
        (out / RESERVE_FILE).unlink(missing_ok=True)
        for step in set(held.saving) - set(complete):
            for partial in (out / "checkpoints").glob(f"{step}.orbax-checkpoint-tmp*"):
                shutil.rmtree(partial, ignore_errors=True)
        with contextlib.suppress(OSError):  # the disk may still be too full for it: the error line says why
            write_run(out, {**plan.record, "status": f"failed at step {held.step}", "error": failure})
    kept = f"the last good checkpoint is step {complete[-1]}" if complete else "no checkpoint was saved"
    return InputError(f"{failure}; training stopped at step {held.step}, {kept} in {out}; fix that, then "
                      "continue with --resume")


# RUN/.reserve: disk space held while training, given back when a write fails, so that run.json can
# still say the run failed on a disk that filled up meanwhile (its rewrite needs a new block)
RESERVE_FILE = ".reserve"
RESERVE_BYTES = 64 << 10


def _reserve(path: Path) -> None:
    """Allocates RESERVE_BYTES of disk to `path` (posix_fallocate where the file system has it)."""
    with open(path, "wb") as f:
        try:
            os.posix_fallocate(f.fileno(), 0, RESERVE_BYTES)
        except (AttributeError, OSError) as exc:
            if isinstance(exc, OSError) and exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            f.write(bytes(RESERVE_BYTES))  # a file system without fallocate: written zeros hold the blocks


def _close_all(metrics_file, ckpts, quiet: bool) -> None:
    """Closes the metrics writer and the checkpoint manager (waiting for its saves), both even when the
    first fails; raises the first error unless `quiet` (another exception is already on its way)."""
    errors = []
    for close in ([metrics_file.close] if metrics_file else []) + [ckpts.close]:
        try:
            close()
        except Exception as exc:  # noqa: BLE001 - the other one is still closed
            errors.append(exc)
    if errors and not quiet:
        raise errors[0]


def _train_written(config: TrainConfig, plan: _Plan, mode: str, cb: Callbacks, main: bool, held: _Held,
                   state: Any, data_state: dict[str, Any]) -> dict[str, Any]:
    """Clears RUN (a new run) or keeps it (a resumed one, restored into `held.ckpts` and `state`), writes
    run.json and trains; `held` follows the step and the saves."""
    import jax

    from jepa_cli.training.checkpoint import Checkpoints, silence_abandoned_reads
    from jepa_cli.training.data import DataLoader
    from jepa_cli.training.run import write_run
    from jepa_cli.training.state import init_state

    out, lengths, objective, tx = plan.out, plan.lengths, plan.objective, plan.tx
    ckpts, start_step = held.ckpts, held.step
    # ---- from here on RUN is written --------------------------------------------------------------
    if main:
        if mode in ("new", "force"):  # 'new' may be a run that never saved a checkpoint: start it over
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
            for name in (METRICS_FILE, RUN_FILE):
                (out / name).unlink(missing_ok=True)
        write_run(out, plan.record)
        _truncate_metrics(out / METRICS_FILE, start_step)
        _reserve(out / RESERVE_FILE)
    # A failed asynchronous save leaves orbax's other writes in flight; they fail too, or end after
    # orbax closed their event loop, each printing a traceback from its thread before the failure
    # reaches this thread: dropped from the start (the error's one line says it all)
    silence_abandoned_reads()
    if ckpts is None:
        ckpts = held.ckpts = Checkpoints(out, keep=config.keep, async_save=config.async_checkpointing, create=True)
    if state is None:
        key = jax.random.PRNGKey(config.seed)
        state = jax.jit(lambda k: init_state(objective, tx, k), out_shardings=plan.state_sh)(key)

    loader = DataLoader(config.data, plan.transform, config.batch_size, config.seed, plan.batch_sh,
                        num_threads=config.num_threads, with_labels=_uses_labels(objective))
    loader.set_state(data_state)
    step_fn = plan.step_fn
    record = plan.record
    ckpt_config = {**record["config"], "lengths": lengths}

    def save(step_no: int) -> None:
        held.saving.append(step_no)
        ckpts.save(step_no, state.as_dict(), loader.get_state(), ckpt_config)
        cb.on_checkpoint(step_no)

    steps = lengths["steps"]
    warning = warmup_warning(lengths)  # told as training starts: a refusal before it stays one line
    if warning:
        cb.on_warning(warning)
    cb.on_start({"run": str(out), "start_step": start_step, "steps": steps, "mesh": dict(plan.mesh.shape),
                 "devices": len(jax.devices()), "processes": jax.process_count(), **lengths})
    stop = _StopFlag()
    stop.install()
    summary: dict[str, Any] = {"run": str(out), "objective": config.objective, "steps": steps}
    last: dict[str, Any] = {}
    saved_at = start_step if ckpts.latest_step() == start_step and ckpts.latest_step() is not None else None
    collapse_reported = False
    rank_peak: float | None = None  # the highest smoothed effective_rank in this process
    rank_smooth: float | None = None  # effective_rank averaged over about the last 20 updates (one batch is noisy)
    metrics_file = MetricsWriter(out, config.tensorboard, config.wandb, config.to_dict()) if main else None
    failed = True
    try:
        if start_step == 0 and steps == 0:
            save(0)
            saved_at = 0
        t_last, n_since = time.perf_counter(), 0

        def record_metrics(step_no: int, metrics: dict) -> None:
            """Logs one step's metrics; stops on divergence (called one step late, see below)."""
            nonlocal t_last, n_since, last, collapse_reported, rank_peak, rank_smooth
            n_since += config.batch_size  # counted here, not at dispatch: rows are written one step late
            host = {k: np.asarray(v) for k, v in jax.device_get(metrics).items()}
            finite = bool(host.pop("finite"))
            probed = probe_results.pop(step_no, None)
            if probed:
                host.update(probed)
                summary["probe"] = {"step": step_no, **probed}
            if step_no % config.log_every == 0 or step_no == steps or not finite or probed:
                now = time.perf_counter()
                rate = n_since / max(now - t_last, 1e-9)
                t_last, n_since = now, 0
                line = {"step": step_no, **_jsonable_metrics(host), "examples_per_sec": rate}
                last = line
                if metrics_file:
                    metrics_file.write(line)
            cb.on_step({"step": step_no, **_jsonable_metrics(host)})
            if not finite:
                ckpts.wait()
                good = ckpts.latest_step()
                record["status"] = f"diverged at step {step_no}"
                if main:
                    write_run(out, record)
                kept = f"the last good checkpoint is step {good}" if good is not None else "no checkpoint was saved"
                raise TrainingDiverged(f"training diverged at step {step_no}: non-finite loss or gradient "
                                       f"(loss={float(host.get('loss', np.nan)):.4g}, "
                                       f"grad_norm={float(host.get('grad_norm', np.nan)):.4g}); {kept} in {out}")
            rank = host.get("effective_rank")
            if rank is not None and np.isfinite(rank):
                rank_smooth = float(rank) if rank_smooth is None else 0.95 * rank_smooth + 0.05 * float(rank)
            if not collapse_reported:
                sign = collapse_sign({**host, "effective_rank": rank_smooth}, config, rank_peak)
                if sign:
                    collapse_reported = True
                    summary["collapse_suspected_at"] = step_no
                    cb.on_log(f"step {step_no}: {sign}")
            if rank_smooth is not None:
                rank_peak = max(rank_smooth, rank_peak or 0.0)

        # Metrics are read one step late: step i+1 is dispatched (and its batch loaded) while step i
        # still runs, so the host never idles the device. Before a checkpoint, the pending step's
        # metrics are read first, so a diverged state is never saved.
        pending: tuple[int, dict] | None = None
        probe_results: dict[int, dict[str, float]] = {}
        if plan.probe is not None and start_step == 0:  # the random initialisation's score: the baseline
            from jepa_cli.evaluation.features import accuracy_text

            row = {"step": 0, **run_probe(plan.probe, objective, state, out)}
            if metrics_file:
                metrics_file.write(row)
            summary["probe"] = row
            cb.on_log(f"step 0: k-NN {accuracy_text(row['knn_top1'], row['knn_top5'])} (the initialisation)")
            t_last = time.perf_counter()
        for i in range(start_step, steps):
            batch = next(loader)
            state, metrics = step_fn(state, batch)
            step_no = held.step = i + 1
            if plan.probe is not None and config.probe_every and step_no % config.probe_every == 0:
                probe_results[step_no] = run_probe(plan.probe, objective, state, out)
            if pending is not None:
                record_metrics(*pending)
            pending = (step_no, metrics)
            cb.after_step(step_no)
            stopping = stop.agreed()  # read once: a signal arriving later is handled next step
            wants_save = bool(config.save_every and step_no % config.save_every == 0)
            if wants_save or stopping or step_no == steps:
                record_metrics(*pending)
                pending = None
            if wants_save:
                save(step_no)
                saved_at = step_no
            if stopping:
                if saved_at != step_no:
                    save(step_no)
                    saved_at = step_no
                summary["interrupted"] = stopping  # the caller says so (the CLI: its last stderr line)
                break
        final = int(jax.device_get(state.step))
        if saved_at != final:
            save(final)
        ckpts.wait()
        record["status"] = "interrupted" if summary.get("interrupted") else "finished"
        if main:
            write_run(out, record)
        failed = False
    finally:
        stop.restore()
        _close_all(metrics_file, ckpts, quiet=failed)
        if main:
            (out / RESERVE_FILE).unlink(missing_ok=True)
    summary.update(step=final, loss=last.get("loss"), checkpoints=ckpts.steps(), last_metrics=last)
    return summary


def _truncate_metrics(path: Path, step: int) -> None:
    """On resume, drops the rows logged after the checkpoint training continues from (and any line
    that is not a row, such as one cut short by a kill), so that no step is listed twice. The file
    is replaced atomically: a kill meanwhile leaves the old file or the new one."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
            keep.append(line)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text("".join(k + "\n" for k in keep))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk mid-write: no half-written copy left beside the file
        raise
