"""The training loop: train(config, objective, callbacks) -> summary.

Validates everything (dataset, objective options, mesh, batch, an existing RUN) before writing
anything, so bad input leaves RUN untouched. SIGINT/SIGTERM finish the current step, save and
return; a non-finite loss or gradient stops the run with the last good checkpoint kept.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jepa_cli.errors import InputError, JepaError
from jepa_cli.training.config import TrainConfig, resolve_lengths
from jepa_cli.training.run import METRICS_FILE, RUN_FILE


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
    on_checkpoint: Callable[[int], None] = _noop
    after_step: Callable[[int], None] = _noop  # after step N is done (tests use it to send signals)


def _check_run_dir(out: Path, resume: bool, force: bool) -> str:
    """'new', 'resume' or 'force'; refuses to write into an existing RUN otherwise."""
    if not out.exists():
        if not out.parent.exists():
            raise InputError(f"{out.parent}: output directory does not exist")
        return "new"
    if not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory")
    is_run = (out / RUN_FILE).exists()
    if not any(out.iterdir()):
        return "new"
    if not is_run:
        raise InputError(f"{out}: exists and is not a training run (refusing to write into it)")
    if resume:
        return "resume"
    if force:
        return "force"
    raise InputError(f"{out}: already holds a run (use --resume to continue it or --force to replace it)")


def _fill_from_dataset(name: str, objective_config: dict, ds: dict) -> dict:
    """Channels and image size default to the dataset's when the objective takes them."""
    from jepa_cli.training.run import make_objective

    cfg = dict(objective_config)
    extra = {}
    if "channels" not in cfg:
        extra["channels"] = ds["channels"]
    if "image_size" not in cfg:
        extra["image_size"] = ds["height"] if ds["height"] == ds["width"] else [ds["height"], ds["width"]]
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
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.signal = signal.Signals(signum).name

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def train(config: TrainConfig, objective=None, callbacks: Callbacks | None = None, resume: bool = False,
          force: bool = False) -> dict[str, Any]:
    """Trains `objective` (built from config.objective when None) as `config` says; returns a summary."""
    import jax

    from jepa_cli.training import mesh as mesh_lib
    from jepa_cli.training.checkpoint import Checkpoints
    from jepa_cli.training.data import DataLoader, check_dataset
    from jepa_cli.training.run import (abstract_state, build_optimizer, make_objective, objective_config_of,
                                       read_run, write_run)
    from jepa_cli.training.state import TrainState, init_state
    from jepa_cli.training.step import jit_step, make_step_fn

    cb = callbacks or Callbacks()
    main = jax.process_index() == 0
    if not main:
        cb = Callbacks()
    if not config.data:
        raise InputError("--data is required")
    if not config.out:
        raise InputError("--out is required")
    out = Path(config.out)

    # ---- validate everything before touching RUN ----------------------------------------------
    ds = check_dataset(config.data)
    lengths = resolve_lengths(config, ds["num_samples"])
    if objective is None:
        config.objective_config = _fill_from_dataset(config.objective, config.objective_config, ds)
        objective = make_objective(config.objective, config.objective_config, lengths["t_max"])
    elif hasattr(objective, "with_total_updates"):
        objective = objective.with_total_updates(lengths["t_max"])
    config.objective_config = objective_config_of(objective, config.objective_config)
    ds_channels = config.objective_config.get("channels")
    if ds_channels is not None and int(ds_channels) != ds["channels"]:
        raise InputError(f"{config.data}: images have {ds['channels']} channels, the model expects {ds_channels}")
    mesh = mesh_lib.make_mesh(config.mesh)
    mesh_lib.check_batch(config.batch_size, mesh, config.grad_accum)
    mode = _check_run_dir(out, resume, force)
    if mode == "resume":
        stored = read_run(out).get("config", {})
        if stored.get("objective") != config.objective:
            raise InputError(f"{out}: holds a {stored.get('objective')!r} run, not {config.objective!r}")

    key = jax.random.PRNGKey(config.seed)
    abstract_params = jax.eval_shape(objective.init, jax.ShapeDtypeStruct((2,), np.uint32))
    tx, lr_fn, wd_fn, momentum_fn = build_optimizer(config, objective, lengths, abstract_params)
    abstract = abstract_state(objective, tx)
    state_sh = mesh_lib.state_shardings(mesh, abstract)
    batch_sh = mesh_lib.batch_sharding(mesh)
    resolved = config.to_dict()
    record = {"jepa_kind": "run", "config": resolved, "lengths": lengths,
              "dataset": {k: v for k, v in ds.items() if k != "attrs"}, "status": "running"}

    ckpts = None
    state = None
    data_state: dict[str, Any] = {}
    start_step = 0
    if mode == "resume" and (out / "checkpoints").exists():
        ckpts = Checkpoints(out, keep=config.keep, async_save=config.async_checkpointing, create=False)
        latest = ckpts.latest_step()
        if latest is not None:
            target = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                                  abstract.as_dict(), state_sh.as_dict())
            restored, data_state, _ = ckpts.restore(latest, target)  # InputError on another model
            state = TrainState.from_dict(restored)
            start_step = int(latest)
    if lengths["steps"] < start_step:
        raise InputError(f"{out}: already at step {start_step}, past --steps {lengths['steps']}")

    # ---- from here on RUN is written --------------------------------------------------------------
    if main:
        if mode == "force":
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
            for name in (METRICS_FILE, RUN_FILE):
                (out / name).unlink(missing_ok=True)
        out.mkdir(exist_ok=True)
        write_run(out, record)
        _truncate_metrics(out / METRICS_FILE, start_step)
    if ckpts is None:
        ckpts = Checkpoints(out, keep=config.keep, async_save=config.async_checkpointing, create=True)
    if state is None:
        state = jax.jit(lambda k: init_state(objective, tx, k), out_shardings=state_sh)(key)

    transform = objective.train_transform(config.objective_config.get("image_size"))
    loader = DataLoader(config.data, transform, config.batch_size, config.seed, batch_sh, num_threads=config.num_threads)
    loader.set_state(data_state)
    step_fn = jit_step(make_step_fn(objective, tx, lr_fn, wd_fn, momentum_fn, config.grad_accum),
                       state_sh, batch_sh, mesh_lib.replicated(mesh))
    ckpt_config = {**resolved, "lengths": lengths}

    def save(step_no: int) -> None:
        ckpts.save(step_no, state.as_dict(), loader.get_state(), ckpt_config)
        cb.on_checkpoint(step_no)

    steps = lengths["steps"]
    cb.on_start({"run": str(out), "start_step": start_step, "steps": steps, "mesh": dict(mesh.shape),
                 "devices": len(jax.devices()), "processes": jax.process_count(), **lengths})
    stop = _StopFlag()
    stop.install()
    summary: dict[str, Any] = {"run": str(out), "objective": config.objective, "steps": steps}
    last: dict[str, Any] = {}
    saved_at = start_step if ckpts.latest_step() == start_step and ckpts.latest_step() is not None else None
    collapse_reported = False
    metrics_file = open(out / METRICS_FILE, "a") if main else None
    try:
        if start_step == 0 and steps == 0:
            save(0)
            saved_at = 0
        t_last, n_since = time.perf_counter(), 0

        def record_metrics(step_no: int, metrics: dict) -> None:
            """Logs one step's metrics; stops on divergence (called one step late, see below)."""
            nonlocal t_last, n_since, last, collapse_reported
            host = {k: np.asarray(v) for k, v in jax.device_get(metrics).items()}
            finite = bool(host.pop("finite"))
            if step_no % config.log_every == 0 or step_no == steps or not finite:
                now = time.perf_counter()
                rate = n_since / max(now - t_last, 1e-9)
                t_last, n_since = now, 0
                line = {"step": step_no, **_jsonable_metrics(host), "examples_per_sec": rate}
                last = line
                if metrics_file:
                    metrics_file.write(json.dumps(line) + "\n")
                    metrics_file.flush()
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
            rs = host.get("repr_std")
            if rs is not None and float(rs) < config.collapse_threshold and not collapse_reported:
                collapse_reported = True
                summary["collapse_suspected_at"] = step_no
                cb.on_log(f"step {step_no}: repr_std {float(rs):.3g} < {config.collapse_threshold:g}: "
                          "the encoder looks collapsed (constant representations)")

        # Metrics are read one step late: step i+1 is dispatched (and its batch loaded) while step i
        # still runs, so the host never idles the device. Before a checkpoint, the pending step's
        # metrics are read first, so a diverged state is never saved.
        pending: tuple[int, dict] | None = None
        for i in range(start_step, steps):
            batch = next(loader)
            state, metrics = step_fn(state, batch)
            step_no = i + 1
            n_since += config.batch_size
            if pending is not None:
                record_metrics(*pending)
            pending = (step_no, metrics)
            cb.after_step(step_no)
            stopping = stop.signal  # read once: a signal arriving later is handled next step
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
                summary["interrupted"] = stopping
                cb.on_log(f"{stopping}: saved step {step_no}, stopping (resume with --resume)")
                break
        final = int(jax.device_get(state.step))
        if saved_at != final:
            save(final)
        ckpts.wait()
        record["status"] = "interrupted" if summary.get("interrupted") else "finished"
        if main:
            write_run(out, record)
    finally:
        stop.restore()
        if metrics_file:
            metrics_file.close()
        ckpts.close()
    summary.update(step=final, loss=last.get("loss"), checkpoints=ckpts.steps(), last_metrics=last)
    return summary


def _truncate_metrics(path: Path, step: int) -> None:
    """On resume, drop lines logged after the checkpoint we continue from."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("step", 0) <= step:
                keep.append(line)
        except ValueError:
            continue
    path.write_text("".join(k + "\n" for k in keep))
