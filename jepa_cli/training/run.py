"""Run directories: building the objective and optimizer from a resolved config, reading RUN/run.json,
the lock a trainer holds on RUN, loading a run's parameters for other commands (encode-latents,
ema-inspect), params_sha256."""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jepa_cli.data.files import DamagedFile, read_json, read_jsonl, replace_file
from jepa_cli.errors import InputError

RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
LOCK_FILE = ".lock"
# The objectives whose options include the model's LayerNorm epsilon `norm_eps`. A config saved without
# it describes a model built with eps 1e-6 (models/layers.NORM_EPS), whatever the objective's default.
NORM_EPS_OBJECTIVES = ("ijepa", "vjepa", "audio-jepa", "lejepa")
SAVED_NORM_EPS = 1e-6


class RunLock:
    """An exclusive advisory lock on a run directory: flock(2) on RUN/.lock, which holds the pid of
    the holder. The kernel drops it when the holder exits, however it exits (SIGKILL included), so a
    lock file left behind is no lock. A second trainer gets an InputError naming the holder."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise busy_run(self.run_dir, holder) from None
            # The previous holder unlinks the file before it lets go (release), so the file we locked
            # may be gone: then lock the one that is there now.
            try:
                current = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    @staticmethod
    def holder(run_dir: str | Path) -> str | None:
        """The pid (as RUN/.lock records it) of a live process holding RUN's lock, or None when no
        process holds it (or the file system cannot lock). Looks without waiting and without
        creating anything."""
        try:
            fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        except OSError:
            return None
        finally:
            os.close(fd)  # also drops the shared lock just taken
        return None

    def release(self) -> None:
        """Removes RUN/.lock, then unlocks (in this order: see acquire)."""
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def busy_run(run_dir: str | Path, holder: str) -> InputError:
    """The refusal of a command that would write RUN while process `holder` trains in it."""
    return InputError(f"{run_dir}: another process (pid {holder}) is training in this run; wait for it to finish "
                      "or stop it")


def run_identity(run_dir: str | Path) -> tuple[int, int, int] | None:
    """Which run.json RUN holds now: (inode, mtime ns, size), changed by every write of it (write_run
    replaces the file); None without one. Tells a run another process wrote since a first look."""
    try:
        info = os.stat(Path(run_dir) / RUN_FILE)
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_size


def is_step_name(name: str) -> bool:
    """Whether a checkpoint folder's `name` is a step: ASCII decimal digits only ('²' is a digit to
    str.isdigit, yet no int)."""
    return name.isascii() and name.isdecimal()


def checkpoint_steps(run_dir: str | Path) -> list[int]:
    """The steps of RUN's complete checkpoints (orbax's temporary directories are not steps)."""
    ckpt_dir = Path(run_dir) / "checkpoints"
    if not ckpt_dir.is_dir():
        return []
    return sorted(int(p.name) for p in ckpt_dir.iterdir() if is_step_name(p.name) and p.is_dir())


def make_objective(name: str, objective_config: dict[str, Any], total_updates: float | None = None):
    """An objective by registry name, or 'module:factory' (factory(config) -> Objective) for
    objectives that live outside the package; then told the run length if it wants it."""
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise InputError(f"cannot load objective {name!r} ({exc})") from None
        objective = factory(dict(objective_config))
    else:
        from jepa_cli.objectives import make_objective as registry_make

        objective = registry_make(name, dict(objective_config))
    if total_updates is not None and hasattr(objective, "with_total_updates"):
        objective = objective.with_total_updates(total_updates)
    return objective


def objective_config_of(objective, fallback: dict[str, Any]) -> dict[str, Any]:
    to_config = getattr(objective, "to_config", None)
    return json.loads(json.dumps(to_config() if to_config else fallback, default=_jsonable))


def build_optimizer(cfg, objective, lengths: dict[str, int], abstract_params: Any):
    """(tx, lr_fn, wd_fn, momentum_fn) for a resolved TrainConfig."""
    import jax

    from jepa_cli.training import optimizer, schedules

    lr_fn = schedules.warmup_cosine(cfg.start_lr, cfg.lr, cfg.final_lr, lengths["warmup_steps"], lengths["t_max"])
    wd_fn = schedules.cosine_wd(cfg.wd, cfg.final_wd, lengths["t_max"])
    mask = jax.tree.map(lambda m: bool(m) if isinstance(m, (bool, np.bool_)) else m,
                        objective.weight_decay_mask(abstract_params))
    tx = optimizer.make_optimizer(lr_fn, wd_fn, mask, cfg.clip_grad, b1=cfg.betas[0], b2=cfg.betas[1],
                                  clip_start=getattr(cfg, "clip_grad_start", 0))
    spec = objective.ema_spec
    momentum_fn = spec.momentum if spec is not None else None
    return tx, lr_fn, wd_fn, momentum_fn


def read_run(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / RUN_FILE
    if not path.exists():
        raise InputError(f"{run_dir}: not a training run (no {RUN_FILE})")
    why = ""
    try:
        record = read_json(path)
    except DamagedFile as exc:
        record, why = None, f"{exc.reason}; "
    if not (isinstance(record, dict) and isinstance(record.get("config"), dict)
            and isinstance(record.get("lengths"), dict)):
        raise InputError(f"{path}: damaged ({why}not the JSON object with 'config' and 'lengths' that jepa train "
                         "writes); each checkpoint keeps a copy in checkpoints/<step>/config/")
    return {**record, "config": saved_config(record["config"])}


def saved_config(config: dict[str, Any]) -> dict[str, Any]:
    """A resolved config as saved in run.json or with a checkpoint, with what it leaves unsaid spelled
    out: options a model was built with that the config does not name get the value it was built
    with (`norm_eps` 1e-6), not the objective's default. A copy; `config` is not changed."""
    objective_config = config.get("objective_config")
    if config.get("objective") in NORM_EPS_OBJECTIVES and isinstance(objective_config, dict) \
            and "norm_eps" not in objective_config:
        return {**config, "objective_config": {**objective_config, "norm_eps": SAVED_NORM_EPS}}
    return config


def write_run(run_dir: str | Path, record: dict[str, Any]) -> None:
    replace_file(Path(run_dir) / RUN_FILE, json.dumps(record, indent=2, default=_jsonable).encode())


def _jsonable(v):
    if hasattr(v, "tolist"):
        return v.tolist()
    if isinstance(v, tuple):
        return list(v)
    return str(v)


def abstract_state(objective, tx, abstract_params: Any = None):
    """The TrainState of ShapeDtypeStructs (no allocation), around `abstract_params` when given (the
    parameter init, the slowest part to trace, is then not traced again)."""
    import jax

    from jepa_cli.training.state import state_from_params

    key = jax.ShapeDtypeStruct((2,), np.uint32)
    if abstract_params is None:
        abstract_params = jax.eval_shape(objective.init, key)
    return jax.eval_shape(lambda params, rng: state_from_params(objective, tx, params, rng), abstract_params, key)


def load_run(run_dir: str | Path, step: int | None = None, on_fallback: Callable[[int, str], None] | None = None):
    """(resolved_config dict, objective, {'params', 'ema'} as host numpy pytrees, step).

    The model is built from the configuration saved with the checkpoint read, not from run.json:
    the weights were trained with it, and run.json is the run's description for people and `jepa
    info` (editing it changes nothing here). `step` None: the newest checkpoint that reads back; each
    newer, damaged one is reported as on_fallback(step, message), and one rotated out while it is
    read (a trainer with --keep) is followed by the newest there is then. A given `step` that is
    damaged is an InputError naming it and the newest intact one, as is a checkpoint that is another
    model's."""
    import jax
    from jax.sharding import SingleDeviceSharding

    from jepa_cli.training.checkpoint import Checkpoints, UnreadableCheckpoint
    from jepa_cli.training.state import TrainState

    record = read_run(run_dir)
    steps = checkpoint_steps(run_dir)
    if not steps:
        raise InputError(f"{run_dir}: holds no checkpoint yet")
    if step is not None and step not in steps:
        raise InputError(f"{run_dir}: no checkpoint at step {step} (checkpoints: {', '.join(map(str, steps))})")
    built: dict[str, Any] = {}
    models: dict[str, tuple[dict[str, Any], Any, Any]] = {}  # by saved config: each is built once

    def target(saved: dict[str, Any]) -> Any:
        """The restore target of the model the checkpoint's own config describes."""
        key = json.dumps(saved, sort_keys=True, default=str)
        if key not in models:
            models[key] = _model_of(saved, record)
        config, objective, abstract = models[key]
        built.update(config=config, objective=objective)
        sharding = SingleDeviceSharding(jax.devices()[0])
        return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), abstract)

    ckpts = Checkpoints(run_dir, keep=None, async_save=False, create=False)
    try:
        if step is None:
            step, state, _data, _cfg = ckpts.restore_newest(target, on_fallback)
        else:
            try:
                state, _data, _cfg = ckpts.restore(step, target)
            except UnreadableCheckpoint as exc:
                intact = ckpts.newest_intact(exclude=step)
                raise UnreadableCheckpoint(f"{exc}; " + (f"the newest intact checkpoint is step {intact} (--step "
                                                         f"{intact})" if intact is not None else
                                                         "no other checkpoint is intact"), step) from None
    finally:
        ckpts.close()
    state = TrainState.from_dict(state)
    host = {"params": jax.tree.map(np.asarray, state.params), "ema": jax.tree.map(np.asarray, state.ema)}
    return built["config"], built["objective"], host, int(step)


def _model_of(saved: dict[str, Any], record: dict[str, Any]) -> tuple[dict[str, Any], Any, Any]:
    """(config, objective, abstract TrainState dict) of a checkpoint's saved config (the resolved
    trainer config plus its "lengths"; run.json's lengths for a checkpoint saved without them)."""
    import jax

    from jepa_cli.training.config import build_config

    config = saved_config({k: v for k, v in saved.items() if k != "lengths"})
    lengths = saved.get("lengths") if isinstance(saved.get("lengths"), dict) else record["lengths"]
    cfg = build_config(config)
    objective = make_objective(cfg.objective, cfg.objective_config)
    abstract_params = jax.eval_shape(objective.init, jax.ShapeDtypeStruct((2,), np.uint32))
    tx, *_ = build_optimizer(cfg, objective, lengths, abstract_params)
    return config, objective, abstract_state(objective, tx, abstract_params).as_dict()


def params_sha256(tree: Any) -> str:
    """A digest of every leaf (path, dtype, shape, bytes) of a pytree, e.g. {'params', 'ema'}."""
    import jax

    h = hashlib.sha256()
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    for path, leaf in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0])):
        arr = np.ascontiguousarray(np.asarray(leaf))
        h.update(jax.tree_util.keystr(path).encode())
        h.update(str(arr.dtype).encode())
        h.update(str(arr.shape).encode())
        h.update(arr.tobytes())
    return h.hexdigest()


class MetricsWriter:
    """Appends rows to RUN/metrics.jsonl (the record every command reads) and, optionally, writes each
    row's finite numbers at the row's step as TensorBoard scalars (`tensorboard_dir`, tensorboardX)
    and to a Weights & Biases run (`wandb_project`, named after RUN, with `run_config` as its config)."""

    def __init__(self, run_dir: str | Path, tensorboard_dir: str | None = None, wandb_project: str | None = None,
                 run_config: dict[str, Any] | None = None) -> None:
        self._file = open(Path(run_dir) / METRICS_FILE, "a")
        self._board = tensorboard_writer(tensorboard_dir) if tensorboard_dir else None
        self._wandb = None
        if wandb_project:
            self._wandb = require_wandb().init(project=wandb_project, name=Path(run_dir).resolve().name,
                                               dir=str(run_dir), config=run_config or {})

    def write(self, row: dict[str, Any]) -> None:
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        scalars = {key: float(value) for key, value in row.items()
                   if key != "step" and isinstance(value, (int, float)) and np.isfinite(value)}
        if self._board is not None:
            for key, value in scalars.items():
                self._board.add_scalar(key, value, int(row["step"]))
            self._board.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=int(row["step"]))

    def close(self) -> None:
        self._file.close()
        if self._board is not None:
            self._board.close()
        if self._wandb is not None:
            self._wandb.finish()


def require_tensorboard() -> type:
    """tensorboardX's SummaryWriter; an InputError naming the extra when it is not installed."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise InputError("--tensorboard needs tensorboardX: pip install 'jepa-cli[tensorboard]'") from None
    return SummaryWriter


def require_wandb():
    """The wandb module; an InputError naming the extra when it is not installed."""
    try:
        import wandb
    except ImportError:
        raise InputError("--wandb needs the wandb package: pip install 'jepa-cli[wandb]'") from None
    return wandb


def tensorboard_writer(directory: str):
    """A TensorBoard event writer on `directory` (created if missing)."""
    return require_tensorboard()(directory)


def read_metrics(run_dir: str | Path, last: int | None = None) -> list[dict[str, Any]]:
    """The rows of RUN/metrics.jsonl (the `last` lines of it when given); a line that is not a row
    (cut short by a kill, not UTF-8 JSON, without an integer step) is skipped, as on resume."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    lines = read_jsonl(path)
    if last is not None:
        lines = lines[-last:]
    out = []
    for _line, row in lines:
        if isinstance(row, dict) and isinstance(row.get("step"), int) and not isinstance(row["step"], bool):
            out.append(row)  # anything else is not a row this trainer wrote
    return out


def loss_curve(metrics: list[dict[str, Any]], points: int = 60) -> dict[str, Any] | None:
    """The logged loss in at most `points` consecutive buckets: the mean loss of each bucket and its
    last step (what `jepa info` draws as a sparkline). None when no finite loss was logged."""
    rows = [(m["step"], m["loss"]) for m in metrics
            if isinstance(m.get("loss"), (int, float)) and np.isfinite(m["loss"]) and "step" in m]
    if not rows:
        return None
    buckets = np.array_split(np.asarray(rows, np.float64), min(points, len(rows)))
    return {"steps": [int(b[-1, 0]) for b in buckets], "loss": [float(b[:, 1].mean()) for b in buckets],
            "first": float(rows[0][1]), "last": float(rows[-1][1])}


# what `jepa info` shows of a model with an S5 block (models/mixer_pattern.py, models/s5.py)
S5_KEYS = ("pred_mixer", "ssm_state", "ssm_step", "scan_order", "ssm_gaps")


def mixer_summary(objective_config: dict[str, Any]) -> dict[str, Any]:
    """The token-mixer options of a run: its `mixer` pattern, and with an S5 block anywhere the
    predictor's pattern, state size, scan order and gaps; {} for an objective without mixers."""
    if "mixer" not in objective_config:
        return {}
    patterns = (objective_config["mixer"], objective_config.get("pred_mixer") or "")
    out = {"mixer": objective_config["mixer"]}
    if any("s5" in pattern.split(",") for pattern in patterns):
        out.update({k: objective_config[k] for k in S5_KEYS if objective_config.get(k) not in (None, "")})
    return out


def describe_run(path: Path, attrs: dict[str, Any]) -> dict[str, Any]:
    """`jepa info RUN`: objective, model (and its token mixers), steps done, checkpoints, latest metrics,
    and params_sha256 of the newest checkpoint that reads back (damaged ones are listed in
    `unreadable_checkpoints`)."""
    record = read_run(path)
    config = record.get("config", {})
    steps = checkpoint_steps(path)
    out: dict[str, Any] = {
        "objective": config.get("objective"),
        "model": config.get("objective_config", {}).get("model"),
        **mixer_summary(config.get("objective_config", {})),
        "dataset": config.get("data"),
        "steps_done": steps[-1] if steps else 0,
        "total_steps": record.get("lengths", {}).get("steps"),
        "checkpoints": steps,
        "batch_size": config.get("batch_size"),
        "mesh": config.get("mesh"),
        "status": record.get("status"),
    }
    metrics = read_metrics(path)
    out["latest_metrics"] = metrics[-1] if metrics else None
    out["loss_curve"] = loss_curve(metrics)
    if steps:
        from jepa_cli.training.checkpoint import UnreadableCheckpoint

        unreadable: list[int] = []
        try:
            _config, _objective, host, step = load_run(path, on_fallback=lambda s, _msg: unreadable.append(s))
        except UnreadableCheckpoint as exc:  # the run is still described, without a digest
            out["unreadable_checkpoints"] = steps
            out["note"] = f"no params_sha256: {exc}"
            return out
        out["params_sha256"] = params_sha256(host)
        out["params_sha256_step"] = step
        if unreadable:
            out["unreadable_checkpoints"] = sorted(unreadable)
    return out
