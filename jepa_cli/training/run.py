"""Runs as objects: building the objective and optimizer from a resolved config, loading a run's
parameters for other commands (encode-latents, ema-inspect), params_sha256, the metric writers and
`jepa info`'s description of a run. RUN's files themselves: training/runfiles.py."""

from __future__ import annotations

import hashlib
import importlib
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jepa_cli.data.jsonvalues import json_value
from jepa_cli.errors import InputError
from jepa_cli.training.runfiles import METRICS_FILE, checkpoint_steps, read_metrics, read_run, saved_config

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
    return json_value(to_config() if to_config else fallback)


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
        self._file.write(json.dumps(json_value(row), allow_nan=False) + "\n")
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
