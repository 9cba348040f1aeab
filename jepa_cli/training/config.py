"""The trainer's configuration: defaults < RUN/run.json (on --resume) < TOML recipe < command line.

A TOML recipe holds trainer keys at the top level and the objective's options in a table named
after the objective (`[ijepa]`); any other key is an InputError naming it. The resolved
configuration is saved in RUN/run.json and in every checkpoint.
"""

from __future__ import annotations

import dataclasses
import math
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
    clip_grad_start: int = 0  # first update that clips (V-JEPA clips only once epoch > warmup)
    betas: tuple[float, float] = (0.9, 0.999)
    # checkpoints and logging
    save_every: int | None = None  # None: only at the end (and on SIGINT/SIGTERM)
    keep: int | None = 3
    async_checkpointing: bool = True
    log_every: int = 1
    collapse_threshold: float = 1e-4  # repr_std or target_std below this is reported as a suspected collapse
    collapse_rank_fraction: float = 0.7  # effective_rank below this x its peak so far is reported too
    num_threads: int = 2  # grain reader threads
    # the k-NN probe of the target encoder during training (evaluation/online.py)
    probe_every: int | None = None  # None: no probe; N: every N updates (and at step 0 of a new run)
    probe_data: str | None = None  # "TRAIN.zarr,TEST.zarr": two labelled datasets of the training modality
    probe_k: int = 20  # neighbours (DINO's k-NN protocol; `jepa probe knn --k`)
    # the objective's own options (IJEPAConfig fields, mask options), as resolved by the objective
    objective_config: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d


TRAINER_KEYS = {f.name for f in dataclasses.fields(TrainConfig)} - {"objective_config"}
RUNTIME_KEYS = {"data", "out"}  # where, not what: never a model mismatch


def load_toml(path: str | Path) -> dict[str, Any]:
    """Reads a recipe; returns {trainer keys..., 'objective_config': {...}}.

    Unknown keys, values of the wrong type or out of range, and syntax errors are InputErrors that
    name the file (and the key, or the line)."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such config file")
    if not path.is_file():
        raise InputError(f"{path}: not a config file (a TOML recipe)")
    try:
        raw = tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a TOML file (not UTF-8 text)") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML ({exc})") from None  # exc names the line and column
    objective = raw.get("objective", TrainConfig.objective)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key == objective and isinstance(value, dict):
            out["objective_config"] = dict(value)
        elif key in TRAINER_KEYS:
            check_value(key, value, f"{path}: {key}")
            out[key] = value
        elif isinstance(value, dict):
            raise InputError(f"{path}: unknown table [{key}] (the objective's options go in [{objective}])")
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
    """A TrainConfig from merged layers; every value is checked (type and range) first."""
    unknown = sorted(set(values) - TRAINER_KEYS - {"objective_config"})
    if unknown:
        raise InputError(f"unknown option {unknown[0]!r}")
    for key, value in values.items():
        if key != "objective_config":
            check_value(key, value, "--" + key.replace("_", "-"))
    values = dict(values)
    if "betas" in values:
        values["betas"] = tuple(values["betas"])
    return TrainConfig(**values)


@dataclasses.dataclass(frozen=True)
class _Rule:
    """What a trainer key accepts: kind 'int' | 'float' | 'str' | 'bool' | 'betas', a range, None or not."""

    kind: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself is excluded (lr > 0)
    nullable: bool = False  # None means "not set" (run.json stores it as null)

    def describe(self) -> str:
        if self.kind == "betas":
            return "two numbers in [0, 1) such as [0.9, 0.999]"
        text = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false"}[self.kind]
        if self.low is not None and self.high is not None:
            return f"{text} in {self.low}..{self.high}"
        if self.low is not None:
            return f"{text} {'>' if self.low_open else '>='} {self.low}"
        return text

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.nullable
        if self.kind == "betas":
            return (isinstance(value, (list, tuple)) and len(value) == 2
                    and all(_is_number(b) and 0 <= b < 1 for b in value))
        if self.kind in ("str", "bool"):
            return isinstance(value, {"str": str, "bool": bool}[self.kind])
        if not (_is_number(value) and (self.kind == "float" or isinstance(value, int))):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or value <= self.high


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


RULES: dict[str, _Rule] = {
    "objective": _Rule("str"),
    "data": _Rule("str", nullable=True),
    "out": _Rule("str", nullable=True),
    "steps": _Rule("int", 0, nullable=True),  # 0: write the initial weights only
    "epochs": _Rule("float", 0, nullable=True),
    "batch_size": _Rule("int", 1),
    "grad_accum": _Rule("int", 1),
    "mesh": _Rule("str"),
    "seed": _Rule("int", 0, 2**32 - 1),  # what numpy and jax.random.PRNGKey accept
    "lr": _Rule("float", 0, low_open=True),
    "start_lr": _Rule("float", 0),
    "final_lr": _Rule("float", 0),
    "warmup_steps": _Rule("int", 0, nullable=True),
    "warmup_epochs": _Rule("float", 0, nullable=True),
    "wd": _Rule("float", 0),
    "final_wd": _Rule("float", 0),
    "ipe_scale": _Rule("float", 0, low_open=True),
    "clip_grad": _Rule("float", 0, low_open=True, nullable=True),
    "clip_grad_start": _Rule("int", 0),
    "betas": _Rule("betas"),
    "save_every": _Rule("int", 1, nullable=True),
    "keep": _Rule("int", 0, nullable=True),  # 0 or None: keep every checkpoint
    "async_checkpointing": _Rule("bool"),
    "log_every": _Rule("int", 1),
    "collapse_threshold": _Rule("float", 0),
    "collapse_rank_fraction": _Rule("float", 0, 1),
    "num_threads": _Rule("int", 1),
    "probe_every": _Rule("int", 1, nullable=True),
    "probe_data": _Rule("str", nullable=True),
    "probe_k": _Rule("int", 1),
}
assert RULES.keys() == TRAINER_KEYS, "every trainer key has a rule"


def check_value(key: str, value: Any, name: str) -> None:
    """InputError `NAME must be <what KEY accepts>, got VALUE` unless `value` fits; `name` is how the
    user wrote the key (`--batch-size`, or `recipe.toml: batch_size`)."""
    rule = RULES[key]
    if not rule.accepts(value):
        raise InputError(f"{name} must be {rule.describe()}, got {value!r}")


def resolve_lengths(cfg: TrainConfig, num_samples: int) -> dict[str, Any]:
    """steps, iterations per epoch, T_max and warmup in optimizer updates (ints), and the EMA ramp's
    length ema_t_max = ipe_scale x steps (a float, as the official momentum generator)."""
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
    from jepa_cli.training.schedules import ema_ramp_length

    return {"steps": steps, "ipe": ipe, "t_max": t_max, "warmup_steps": warmup,
            "ema_t_max": ema_ramp_length(steps, cfg.ipe_scale)}


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
