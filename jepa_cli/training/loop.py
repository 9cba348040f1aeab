"""The training loop: train(config, objective, callbacks) -> summary.

Validates everything first (training/plan.py: dataset, objective options, mesh, batch, an existing
RUN, and the step itself, traced once on abstract values so that trace-time checks such as the mask
options run) before writing anything, so bad input leaves RUN untouched or, for a new run, absent.
While it trains, process 0 holds RUN's lock (runfiles.run_lock): a second trainer on the same RUN is
refused. SIGINT/SIGTERM finish the current step, save and return (a second signal stops at once); a
non-finite loss or gradient stops the run with the last good checkpoint kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable

import numpy as np

from jepa_cli.data.jsonvalues import json_value
from jepa_cli.data.urls import BucketPath
from jepa_cli.errors import InputError, JepaError, StopRequest, signals_handled, storage_failure
from jepa_cli.training.bucket_run import bucket_run, mirrored
from jepa_cli.training.config import TrainConfig, warmup_warning
from jepa_cli.training.plan import Plan, ProbeFactory, QualityFactory, make_plan, uses_labels
from jepa_cli.training.rundir import RESERVE_FILE, lock_run, start_writing, storage_stop
from jepa_cli.training.run import MetricsWriter
from jepa_cli.training.runfiles import write_run


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
    on_probe: Callable[[dict], None] = _noop  # a training-time probe's row {"step", its scores, "probe_seconds"}
    after_step: Callable[[int], None] = _noop  # after step N is done (tests use it to send signals)


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


def agreed_stop(stop: StopRequest) -> str | None:
    """The signal to stop on at this step, the same in every process: with several processes, a
    signal that reached any of them (they save together, so they must stop at the same step).
    One tiny host all-gather per step, only in multi-process runs."""
    import jax

    if jax.process_count() == 1:
        return stop.signal
    from jax.experimental import multihost_utils

    names = ("SIGINT", "SIGTERM")
    mine = np.int32(names.index(stop.signal) + 1 if stop.signal in names else 0)
    code = int(np.max(multihost_utils.process_allgather(mine)))
    return names[code - 1] if code else None


def train(config: TrainConfig, objective=None, callbacks: Callbacks | None = None, resume: bool = False,
          force: bool = False, allow_new_data: bool = False, make_probe: ProbeFactory | None = None,
          make_quality: QualityFactory | None = None) -> dict[str, Any]:
    """Trains `objective` (built from config.objective when None) as `config` says; returns a summary.
    A resumed run keeps the dataset it was started on; `allow_new_data` lets it continue on another
    one (plan.py `_check_same_dataset`). `make_probe` builds the probe --probe-every runs (plan.py
    ProbeFactory; `jepa train` passes evaluation.online.training_probe), `make_quality` the signal
    logged as `sigreg_quality` (QualityFactory; `jepa train` passes evaluation.quality.training_quality)."""
    import jax

    url = bucket_run(config.out)
    if url is not None:
        return _train_in_bucket(url, config, objective, callbacks, resume, force, allow_new_data, make_probe,
                                make_quality)
    main = jax.process_index() == 0
    cb = (callbacks or Callbacks()) if main else Callbacks()
    plan = make_plan(config, objective, resume, force, allow_new_data, make_probe, make_quality)
    created = main and not plan.out.exists()
    lock, mode = lock_run(plan.out, main, plan.mode, resume, force, plan.seen)
    try:
        return _train_locked(config, plan, mode, cb, main)
    finally:
        if lock is not None:
            lock.release()
        if created and plan.out.is_dir() and not any(plan.out.iterdir()):
            plan.out.rmdir()  # failed before writing anything: leave no trace


def _train_in_bucket(url: BucketPath, config: TrainConfig, objective, callbacks: Callbacks | None, resume: bool,
                     force: bool, allow_new_data: bool, make_probe: ProbeFactory | None,
                     make_quality: QualityFactory | None) -> dict[str, Any]:
    """`train` of a run in a bucket: in a local mirror of it, under its writer lease, uploaded at each
    checkpoint save and when training stops (training/bucket_run.py). Single-process training only: the
    mirror is one host's folder."""
    import jax

    if jax.process_count() > 1:
        raise InputError(f"--out {url}: a run in a bucket is trained by one process (its local mirror is one "
                         "host's); write a multi-process run to a folder every host shares")
    cb = callbacks or Callbacks()
    with mirrored(url, resume, force) as upload:
        def on_checkpoint(step: int) -> None:
            cb.on_checkpoint(step)
            upload.sync()

        local = dataclasses.replace(config, out=str(upload.mirror))
        hooks = dataclasses.replace(cb, on_checkpoint=on_checkpoint,
                                    on_start=lambda info: cb.on_start({**info, "run": str(url)}))
        try:
            summary = train(local, objective, hooks, resume, force, allow_new_data, make_probe, make_quality)
        except JepaError:
            with contextlib.suppress(JepaError):  # what the trainer wrote before it stopped (run.json's status)
                upload.sync()
            raise
        upload.sync()
    return {**summary, "run": str(url)}


def _restore(plan: Plan, config: TrainConfig, cb: Callbacks, main: bool):
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


def _train_locked(config: TrainConfig, plan: Plan, mode: str, cb: Callbacks, main: bool) -> dict[str, Any]:
    """The part of train() that runs holding RUN's lock: restore (`mode` "resume") or clear RUN, then train.
    A write the file system refuses (a full disk, ...) stops the run in one InputError (rundir.storage_stop)."""
    out, lengths = plan.out, plan.lengths
    ckpts, state, data_state, start_step = None, None, {}, 0
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
        raise storage_stop(plan.out, plan.record, held, failure, main) from None


def _train_written(config: TrainConfig, plan: Plan, mode: str, cb: Callbacks, main: bool, held: _Held,
                   state: Any, data_state: dict[str, Any]) -> dict[str, Any]:
    """Clears RUN (a new run) or keeps it (a resumed one, restored into `held.ckpts` and `state`), writes
    run.json and trains; `held` follows the step and the saves."""
    import jax

    from jepa_cli.training.abandoned_reads import silence_abandoned_reads
    from jepa_cli.training.checkpoint import Checkpoints
    from jepa_cli.training.data import DataLoader
    from jepa_cli.training.state import init_state

    out, lengths = plan.out, plan.lengths
    # ---- from here on RUN is written --------------------------------------------------------------
    if main:
        start_writing(out, mode, plan.record, held.step)
    # A failed asynchronous save leaves orbax's other writes in flight; they fail too, or end after
    # orbax closed their event loop, each printing a traceback from its thread before the failure
    # reaches this thread: dropped from the start (the error's one line says it all)
    silence_abandoned_reads()
    if held.ckpts is None:
        held.ckpts = Checkpoints(out, keep=config.keep, async_save=config.async_checkpointing, create=True)
    if state is None:
        key = jax.random.PRNGKey(config.seed)
        state = jax.jit(lambda k: init_state(plan.objective, plan.tx, k), out_shardings=plan.state_sh)(key)
    loader = DataLoader(config.data, plan.transform, config.batch_size, config.seed, plan.batch_sh,
                        num_threads=config.num_threads, with_labels=uses_labels(plan.objective))
    loader.set_state(data_state)
    from jepa_cli.training.ema import ema_warning

    # told as training starts: a refusal before them stays one line
    for warning in (plan.geometry, warmup_warning(lengths), ema_warning(plan.objective, lengths["steps"])):
        if warning:
            cb.on_warning(warning)
    cb.on_start({"run": str(out), "start_step": held.step, "steps": lengths["steps"], "mesh": dict(plan.mesh.shape),
                 "devices": len(jax.devices()), "processes": jax.process_count(), **lengths})
    stop, session, failed = StopRequest(), None, True
    try:
        with signals_handled(stop):  # the first signal stops at the end of the step, after a save
            session = _Session(config, plan, cb, main, held, state, loader, plan.quality)
            session.run(stop)
        failed = False
    finally:
        _close_all(session and session.metrics_file, held.ckpts, quiet=failed)
        if main:
            (out / RESERVE_FILE).unlink(missing_ok=True)
    return {**session.summary, "checkpoints": held.ckpts.steps()}


class _Session:
    """Training once RUN is written: the steps, their metrics rows (read one step late), the saves, the
    probe, the quality signal (`quality`: evaluation/quality.py, None when off), the stop on a signal or
    a divergence, the collapse warning. `held` follows the step and the saves (for rundir.storage_stop)."""

    def __init__(self, config: TrainConfig, plan: Plan, cb: Callbacks, main: bool, held: _Held, state: Any,
                 loader: Any, quality: Callable[[Any], Any] | None = None) -> None:
        self.config, self.plan, self.cb, self.main, self.held = config, plan, cb, main, held
        self.state, self.loader = state, loader
        self.steps = plan.lengths["steps"]
        self.start_step = held.step
        self.ckpt_config = {**plan.record["config"], "lengths": plan.lengths}
        self.summary: dict[str, Any] = {"run": str(plan.out), "objective": config.objective, "steps": self.steps}
        self.last: dict[str, Any] = {}  # the last row written to metrics.jsonl
        latest = held.ckpts.latest_step()
        self.saved_at = self.start_step if latest == self.start_step and latest is not None else None
        self.collapse = _CollapseWatch(config)
        self.probe_results: dict[int, dict[str, float]] = {}  # scores of steps whose metrics are not read yet
        self.quality = quality
        self.quality_results: dict[int, Any] = {}  # device scalars, read with their step's metrics
        self.metrics_file = (MetricsWriter(plan.out, config.tensorboard, config.wandb, config.to_dict())
                             if main else None)
        self.t_last, self.n_since = time.perf_counter(), 0  # the examples/s of the next row

    def run(self, stop: StopRequest) -> None:
        """Trains from `held.step` to the run's end or a signal agreed by every process, saves the
        final state and marks run.json finished or interrupted; fills `summary` (but its checkpoints)."""
        import jax

        if self.start_step == 0 and self.steps == 0:
            self.save(0)
        self.t_last, self.n_since = time.perf_counter(), 0
        if self.plan.probe is not None and self.start_step == 0:  # the random initialisation's score: the baseline
            self.probe_baseline()
        # Metrics are read one step late: step i+1 is dispatched (and its batch loaded) while step i
        # still runs, so the host never idles the device. Before a checkpoint, the pending step's
        # metrics are read first, so a diverged state is never saved.
        pending: tuple[int, dict] | None = None
        for i in range(self.start_step, self.steps):
            batch = next(self.loader)
            self.state, metrics = self.plan.step_fn(self.state, batch)
            step_no = self.held.step = i + 1
            if self.plan.probe is not None and self.config.probe_every and step_no % self.config.probe_every == 0:
                self.probe_results[step_no] = self.plan.probe(self.state)
            if self.quality is not None and (step_no % self.config.log_every == 0 or step_no == self.steps):
                self.quality_results[step_no] = self.quality(self.target_encoder())
            if pending is not None:
                self.record(*pending)
            pending = (step_no, metrics)
            self.cb.after_step(step_no)
            stopping = agreed_stop(stop)  # read once: a signal arriving later is handled next step
            wants_save = bool(self.config.save_every and step_no % self.config.save_every == 0)
            if wants_save or stopping or step_no == self.steps:
                self.record(*pending)
                pending = None
            if wants_save or (stopping and self.saved_at != step_no):
                self.save(step_no)
            if stopping:
                self.summary["interrupted"] = stopping  # the caller says so (the CLI: its last stderr line)
                break
        final = int(jax.device_get(self.state.step))
        if self.saved_at != final:
            self.save(final)
        self.held.ckpts.wait()
        self.plan.record["status"] = "interrupted" if self.summary.get("interrupted") else "finished"
        if self.main:
            write_run(self.plan.out, self.plan.record)
        self.summary.update(step=final, loss=self.last.get("loss"), last_metrics=self.last)

    def save(self, step_no: int) -> None:
        self.held.saving.append(step_no)
        self.held.ckpts.save(step_no, self.state.as_dict(), self.loader.get_state(), self.ckpt_config)
        self.saved_at = step_no
        self.cb.on_checkpoint(step_no)

    def target_encoder(self) -> Any:
        """The current state's target (EMA) encoder parameters, the encoder downstream commands use."""
        from jepa_cli.training.encoder import select_encoder

        return select_encoder(self.plan.objective, {"params": self.state.params, "ema": self.state.ema}, "target",
                              self.plan.out)

    def probe_baseline(self) -> None:
        """The probe's score of the initialisation: the row of step 0."""
        row = {"step": 0, **self.plan.probe(self.state)}
        if self.metrics_file:
            self.metrics_file.write(row)
        self.summary["probe"] = row
        self.cb.on_probe(row)
        self.t_last = time.perf_counter()

    def record(self, step_no: int, metrics: dict) -> None:
        """Logs one step's metrics; stops on divergence (called one step late, see run)."""
        import jax

        config = self.config
        self.n_since += config.batch_size  # counted here, not at dispatch: rows are written one step late
        host = {k: np.asarray(v) for k, v in jax.device_get(metrics).items()}
        finite = bool(host.pop("finite"))
        probed = self.probe_results.pop(step_no, None)
        if step_no in self.quality_results:
            host["sigreg_quality"] = np.asarray(jax.device_get(self.quality_results.pop(step_no)))
        if probed:
            host.update(probed)
            self.summary["probe"] = {"step": step_no, **probed}
            self.cb.on_probe({"step": step_no, **probed})
        if step_no % config.log_every == 0 or step_no == self.steps or not finite or probed:
            now = time.perf_counter()
            rate = self.n_since / max(now - self.t_last, 1e-9)
            self.t_last, self.n_since = now, 0
            self.last = {"step": step_no, **json_value(host), "examples_per_sec": rate}
            if self.metrics_file:
                self.metrics_file.write(self.last)
        self.cb.on_step({"step": step_no, **json_value(host)})
        if not finite:
            self.diverged(step_no, host)
        sign = self.collapse.update(host)
        if sign:
            self.summary["collapse_suspected_at"] = step_no
            self.cb.on_log(f"step {step_no}: {sign}")

    def diverged(self, step_no: int, host: dict[str, Any]) -> None:
        """Marks run.json diverged at `step_no` and raises TrainingDiverged naming the last good checkpoint."""
        ckpts = self.held.ckpts
        ckpts.wait()
        good = ckpts.latest_step()
        self.plan.record["status"] = f"diverged at step {step_no}"
        if self.main:
            write_run(self.plan.out, self.plan.record)
        kept = f"the last good checkpoint is step {good}" if good is not None else "no checkpoint was saved"
        raise TrainingDiverged(f"training diverged at step {step_no}: non-finite loss or gradient "
                               f"(loss={float(host.get('loss', np.nan)):.4g}, "
                               f"grad_norm={float(host.get('grad_norm', np.nan)):.4g}); {kept} in {self.plan.out}")


class _CollapseWatch:
    """Follows the steps' metrics for a collapse (collapse_sign), told once per run: effective_rank
    averaged over about the last 20 updates (one batch is noisy) against the highest that average
    reached earlier."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        self.reported = False
        self.rank_peak: float | None = None
        self.rank_smooth: float | None = None

    def update(self, host: dict[str, Any]) -> str | None:
        """The collapse sentence the first time one update's metrics show it, else None."""
        rank = host.get("effective_rank")
        if rank is not None and np.isfinite(rank):
            self.rank_smooth = float(rank) if self.rank_smooth is None else 0.95 * self.rank_smooth + 0.05 * float(rank)
        sign = None
        if not self.reported:
            sign = collapse_sign({**host, "effective_rank": self.rank_smooth}, self.config, self.rank_peak)
            self.reported = sign is not None
        if self.rank_smooth is not None:
            self.rank_peak = max(self.rank_smooth, self.rank_peak or 0.0)
        return sign


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
