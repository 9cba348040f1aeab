"""The trainer's configuration: defaults < RUN/run.json (on --resume) < TOML recipe < command line.

A TOML recipe holds trainer keys at the top level and the objective's options in a table named
after the objective (`[ijepa]`); any other key is an InputError naming it. The resolved
configuration is saved in RUN/run.json and in every checkpoint.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from jepa_cli.errors import InputError


@dataclasses.dataclass
class TrainConfig:
    objective: str = "ijepa"
    data: str | None = None
    out: str | None = None
    # length: --steps wins over --epochs; epochs use ipe = num_samples // batch_size
    steps: int | None = None
    epochs: float | None = None
    batch_size: int = 64  # global examples per optimizer update (split into grad_accum micro-batches)
    grad_accum: int = 1
    mesh: str = "data=-1,fsdp=1"
    seed: int = 0
    # optimizer and schedules (official I-JEPA defaults, configs/in1k_vith14_ep300.yaml)
    lr: float = 1e-3
    start_lr: float = 2e-4
    final_lr: float = 1e-6
    warmup_steps: int | None = None
    warmup_epochs: float | None = None  # None and no warmup_steps: 40/300 of the run, as the official ratio
    wd: float = 0.04
    final_wd: float = 0.4
    ipe_scale: float = 1.0
    clip_grad: float | None = None
    betas: tuple[float, float] = (0.9, 0.999)
    # checkpoints and logging
    save_every: int | None = None  # None: only at the end (and on SIGINT/SIGTERM)
    keep: int | None = 3
    async_checkpointing: bool = True
    log_every: int = 1
    collapse_threshold: float = 1e-4  # repr_std below this is reported as a suspected collapse
    num_threads: int = 2  # grain reader threads
    # the objective's own options (IJEPAConfig fields, mask options), as resolved by the objective
    objective_config: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d


TRAINER_KEYS = {f.name for f in dataclasses.fields(TrainConfig)} - {"objective_config"}
RUNTIME_KEYS = {"data", "out"}  # where, not what: never a model mismatch


def load_toml(path: str | Path) -> dict[str, Any]:
    """Reads a recipe; returns {trainer keys..., 'objective_config': {...}}; unknown keys: InputError."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such config file")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML ({exc})") from None
    objective = raw.get("objective", TrainConfig.objective)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key == objective and isinstance(value, dict):
            out["objective_config"] = dict(value)
        elif key in TRAINER_KEYS:
            out[key] = value
        else:
            raise InputError(f"{path}: unknown key {key!r}")
    return out


def merge(*layers: dict[str, Any]) -> dict[str, Any]:
    """Later layers win; objective_config dicts are merged key by key; None values are skipped."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in (layer or {}).items():
            if value is None:
                continue
            if key == "objective_config":
                out[key] = {**out.get(key, {}), **{k: v for k, v in value.items() if v is not None}}
            else:
                out[key] = value
    return out


def build_config(values: dict[str, Any]) -> TrainConfig:
    unknown = sorted(set(values) - TRAINER_KEYS - {"objective_config"})
    if unknown:
        raise InputError(f"unknown option {unknown[0]!r}")
    values = dict(values)
    if "betas" in values:
        values["betas"] = tuple(values["betas"])
    cfg = TrainConfig(**values)
    for name in ("batch_size", "grad_accum", "log_every"):
        if getattr(cfg, name) is None or int(getattr(cfg, name)) <= 0:
            raise InputError(f"--{name.replace('_', '-')} must be positive, got {getattr(cfg, name)}")
    if cfg.steps is not None and cfg.steps < 0:
        raise InputError(f"--steps must be >= 0, got {cfg.steps}")
    if cfg.epochs is not None and cfg.epochs < 0:
        raise InputError(f"--epochs must be >= 0, got {cfg.epochs}")
    if cfg.save_every is not None and cfg.save_every <= 0:
        raise InputError(f"--save-every must be positive, got {cfg.save_every}")
    if cfg.ipe_scale <= 0:
        raise InputError(f"--ipe-scale must be positive, got {cfg.ipe_scale}")
    return cfg


def resolve_lengths(cfg: TrainConfig, num_samples: int) -> dict[str, int]:
    """steps, iterations per epoch, T_max and warmup in optimizer updates."""
    ipe = num_samples // cfg.batch_size
    if ipe == 0:
        raise InputError(f"--batch-size {cfg.batch_size} is larger than the dataset ({num_samples} examples)")
    if cfg.steps is not None:
        steps = int(cfg.steps)
    elif cfg.epochs is not None:
        steps = int(round(cfg.epochs * ipe))
    else:
        raise InputError("give --steps or --epochs (or set one in --config)")
    t_max = max(1, int(cfg.ipe_scale * steps))
    if cfg.warmup_steps is not None:
        warmup = int(cfg.warmup_steps)
    elif cfg.warmup_epochs is not None:
        warmup = int(cfg.warmup_epochs * ipe)
    else:
        warmup = int(steps * 40 / 300)
    return {"steps": steps, "ipe": ipe, "t_max": t_max, "warmup_steps": warmup}


def resolve_config(cli_values: dict[str, Any], toml_path: str | Path | None = None, resume: bool = False) -> TrainConfig:
    """defaults < RUN/run.json (when resuming an existing run) < TOML recipe < command line."""
    stored: dict[str, Any] = {}
    out = cli_values.get("out")
    if resume and out and (Path(out) / "run.json").exists():
        from jepa_cli.training.run import read_run

        stored = dict(read_run(out).get("config", {}))
        stored["objective_config"] = {k: v for k, v in stored.get("objective_config", {}).items()
                                      if k != "total_updates"}  # recomputed from the run length
        toml_layer = load_toml(toml_path) if toml_path else {}
        name = toml_layer.get("objective", cli_values.get("objective")) or stored.get("objective")
        if name != stored.get("objective"):
            raise InputError(f"{out}: holds a {stored.get('objective')!r} run, not {name!r}")
        return build_config(merge(stored, toml_layer, cli_values))
    toml_layer = load_toml(toml_path) if toml_path else {}
    return build_config(merge(toml_layer, cli_values))
