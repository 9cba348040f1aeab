"""The trainer's configuration: defaults < RUN/run.json (on --resume) < TOML recipe < command line (a
JEPA_TRAIN_<KEY> variable stands for its option, docs/cli-conventions.md). Each trainer key is declared
once, as a TrainConfig field (options.option: default, help, what it accepts).

A TOML recipe holds trainer keys at the top level and the objective's options in a table named
after the objective (`[ijepa]`); any other key is an InputError naming it. The resolved
configuration is saved in RUN/run.json and in every checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from pathlib import Path
from typing import Any

from jepa_cli.data.urls import is_bucket, location
from jepa_cli.errors import InputError
from jepa_cli.names import OBJECTIVE_NAMES
from jepa_cli.options import Flag, check, flags, option


# The optimizer and the schedules count updates in int32 (training/optimizer.py): a run is at most this long.
MAX_UPDATES = 2**31 - 1


@dataclasses.dataclass
class TrainConfig:
    objective: str = option("ijepa", "What is learned: ijepa | vjepa (video) | audio-jepa | flow | diffusion | lejepa.",
                            choices=OBJECTIVE_NAMES, allow_module=True)
    data: str | None = option(None, "Dataset directory (zarr v3, from jepa ingest).")
    out: str | None = option(None, "Run directory (checkpoints, metrics.jsonl, run.json).",
                             names=("--output", "-o", "--out"))
    # length: --steps wins over --epochs; epochs use ipe = num_samples // batch_size
    steps: int | None = option(None, "Optimizer updates in the run (wins over --epochs; 0 writes the initial weights).",
                               low=0, high=MAX_UPDATES)
    epochs: float | None = option(None, "Epochs; one epoch is num_samples // batch_size updates.", low=0)
    batch_size: int = option(64, "Global examples per optimizer update.", low=1)
    grad_accum: int = option(1, "Split each batch into K micro-batches (one update).", low=1)
    mesh: str = option("data=-1,fsdp=1", "Device mesh, e.g. data=-1,fsdp=1 (-1 takes the rest).")
    device_normalise: bool = option(False, "Send the resized pixels to the device as uint8 and normalise them in the "
                                    "train step: a quarter of the bytes per batch, the same float32 numbers to one "
                                    "rounding (ijepa, vjepa).")
    seed: int = option(0, "Seed of initialisation, data order and masks.",
                       low=0, high=2**32 - 1)  # what numpy and jax.random.PRNGKey accept
    # optimizer and schedules (official I-JEPA defaults, configs/in1k_vith14_ep300.yaml)
    lr: float = option(1e-3, "Peak learning rate (after the linear warmup).", above=0)
    start_lr: float = option(2e-4, "Learning rate at the start of the warmup.", low=0)
    final_lr: float = option(1e-6, "Learning rate at the end of the cosine decay.", low=0)
    warmup_steps: int | None = option(None, "Warmup in updates (wins over --warmup-epochs; default 40/300 of the run).",
                                      low=0, high=MAX_UPDATES)
    warmup_epochs: float | None = option(None, "Warmup in epochs.", low=0)
    wd: float = option(0.04, "Weight decay at the start (cosine ramp to --final-wd).", low=0)
    final_wd: float = option(0.4, "Weight decay at the end.", low=0)
    ipe_scale: float = option(1.0, "Schedules run over steps x ipe_scale (official 1.0).", above=0)
    # the EMA ramp on its own length: Audio-JEPA ramps over 50 epochs' updates while it stops at 100k updates
    ema_ramp_steps: int | None = option(None, "EMA momentum ramp length in updates (wins over --ema-ramp-epochs; "
                                        "default: the run's steps x ipe_scale).", low=1, high=MAX_UPDATES)
    ema_ramp_epochs: float | None = option(None, "EMA momentum ramp length in epochs (num_samples // batch_size "
                                           "updates each).", above=0)
    clip_grad: float | None = option(None, "Clip the global gradient norm to this value (default: no clipping).",
                                     above=0)
    clip_grad_start: int = option(0, "First update that clips.", low=0)  # V-JEPA clips only once epoch > warmup
    betas: tuple[float, float] = option((0.9, 0.999), "AdamW betas B1,B2.", low=0, below=1, metavar="B1,B2")
    # checkpoints and logging
    save_every: int | None = option(None, "Checkpoint every N updates (always at the end and on SIGINT/SIGTERM).",
                                    low=1)
    keep: int | None = option(3, "Keep the K most recent checkpoints (0: all).", low=0)
    async_checkpointing: bool = option(True, "Write checkpoints in the background while training goes on.")
    log_every: int = option(1, "Write metrics.jsonl (and a plain log line when stderr is not a terminal) every N "
                            "updates.", low=1)
    collapse_threshold: float = option(1e-4, "Warn when repr_std or target_std falls below this.", low=0)
    collapse_rank_fraction: float = option(0.7, "Warn when effective_rank falls below this fraction of its peak.",
                                           low=0, high=1)
    tensorboard: str | None = option(None, "Also write every logged metric as TensorBoard events into this folder "
                                     "(the tensorboard extra; metrics.jsonl stays the record).")
    wandb: str | None = option(None, "Also log every metric to this Weights & Biases project (the wandb extra; set "
                               "WANDB_MODE=offline without network; metrics.jsonl stays the record).")
    num_threads: int = option(2, "Reader threads of the input pipeline.", low=1)
    # the k-NN probe of the target encoder during training (evaluation/online.py)
    probe_every: int | None = option(None, "Score the target encoder with a k-NN probe every N updates (and at "
                                     "step 0); needs --probe-data.", low=1)
    probe_data: str | None = option(None, "TRAIN.zarr,TEST.zarr: the labelled datasets of --probe-every (kept in "
                                    "memory).")
    probe_k: int = option(20, "Neighbours of the training-time k-NN probe.",
                          low=1)  # DINO's k-NN protocol; `jepa probe knn --k`
    # the label-free figure of the target encoder (evaluation/quality.py)
    quality_batch: int = option(256, "Log sigreg_quality every --log-every updates: SIGReg of the target encoder's "
                                "pooled features of the first N training examples (fewer if the dataset is smaller), "
                                "on fixed directions; 0 turns it off.", low=0)
    # the objective's own options (IJEPAConfig fields, mask options), as resolved by the objective
    objective_config: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d


# Each trainer key's declaration (options.Flag): its `jepa train` option, TOML key and value check
TRAINER_FLAGS: dict[str, Flag] = {flag.name: flag for flag in flags(TrainConfig, flagged_only=False)}
TRAINER_KEYS = set(TRAINER_FLAGS)


BUILTIN_PREFIX = "builtin:"


def builtin_recipes() -> list[str]:
    """The recipes shipped inside the package (jepa_cli/recipes/NAME.toml), by NAME."""
    return sorted(p.stem for p in BUILTIN_RECIPES_DIR.glob("*.toml"))


BUILTIN_RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"


def recipe_path(path: str | Path) -> Path:
    """A recipe's file: `builtin:NAME` is jepa_cli/recipes/NAME.toml (an installed `jepa` needs no clone);
    anything else is a path."""
    text = str(path)
    if not text.startswith(BUILTIN_PREFIX):
        return Path(path)
    name = text[len(BUILTIN_PREFIX):]
    if name not in builtin_recipes():
        raise InputError(f"{text}: no such built-in recipe (known: "
                         f"{', '.join(BUILTIN_PREFIX + n for n in builtin_recipes())})")
    return BUILTIN_RECIPES_DIR / f"{name}.toml"


def load_toml(path: str | Path) -> dict[str, Any]:
    """Reads a recipe; returns {trainer keys..., 'objective_config': {...}}.

    Unknown keys, values of the wrong type or out of range, and syntax errors are InputErrors that
    name the file (and the key, or the line)."""
    path = recipe_path(path)
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
            check(TRAINER_FLAGS[key], value, f"{path}: {key}")
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
            check(TRAINER_FLAGS[key], value, TRAINER_FLAGS[key].flag)
    values = dict(values)
    if "betas" in values:
        values["betas"] = tuple(values["betas"])
    return TrainConfig(**values)


def resolve_lengths(cfg: TrainConfig, num_samples: int) -> dict[str, Any]:
    """steps, iterations per epoch, T_max and warmup in optimizer updates (ints), and the EMA ramp's
    length ema_t_max (schedules.ema_ramp_length: ipe_scale x steps, a float as the official momentum
    generator, unless ema_ramp_steps or ema_ramp_epochs gives its own)."""
    ipe = num_samples // cfg.batch_size
    if ipe == 0:
        raise InputError(f"--batch-size {cfg.batch_size} is larger than the dataset ({num_samples} examples)")
    if cfg.steps is not None:
        steps = int(cfg.steps)
    elif cfg.epochs is not None:
        steps = int(round(cfg.epochs * ipe))
    else:
        raise InputError("give --steps or --epochs (or set one in --config)")
    if steps > MAX_UPDATES:
        raise InputError(f"--epochs {cfg.epochs:g} makes {steps:.3g} updates of {cfg.batch_size}; a run is at most "
                         f"{MAX_UPDATES} updates")
    from jepa_cli.training.schedules import ema_ramp_length, total_steps

    t_max = total_steps(steps, cfg.ipe_scale)
    if cfg.warmup_steps is not None:
        warmup = int(cfg.warmup_steps)
    elif cfg.warmup_epochs is not None:
        warmup = min(int(cfg.warmup_epochs * ipe), MAX_UPDATES)
    else:
        warmup = int(steps * 40 / 300)
    return {"steps": steps, "ipe": ipe, "t_max": t_max, "warmup_steps": warmup,
            "ema_t_max": ema_ramp_length(steps, cfg.ipe_scale, cfg.ema_ramp_steps, cfg.ema_ramp_epochs, ipe)}


def length_notes(lengths: dict[str, Any]) -> dict[str, str]:
    """Notes for `jepa train --print-config` beside the trainer's length keys ({key: note}): the warmup
    of a run whose learning rate never reaches its peak (warmup_warning), so the printed recipe says
    what training would warn about."""
    warning = warmup_warning(lengths)
    return {"warmup_steps": warning} if warning else {}


def warmup_warning(lengths: dict[str, Any]) -> str | None:
    """The warning for a run whose learning rate never reaches its peak: a warmup (in updates) that is
    not shorter than the run's length, which a short run of a long recipe (`--steps 150` on a warmup
    of 200) gives without a word otherwise. The warmup is kept as set (run.json records what was asked
    for); the line suggests the default share, 40/300 of the run. None when the warmup fits, or for a
    run of no update (`--steps 0`, a random-init baseline)."""
    steps, warmup = lengths["steps"], lengths["warmup_steps"]
    if steps <= 0 or warmup < steps:
        return None
    suggested = max(1, int(steps * 40 / 300))
    return (f"warmup_steps {warmup} is not shorter than the run's {steps} updates: the learning rate never "
            f"reaches lr; set --warmup-steps (e.g. {suggested})")


def to_toml(config: TrainConfig, notes: dict[str | None, dict[str, str]] | None = None) -> str:
    """A resolved configuration as a TOML recipe: every trainer key at the top level and the objective's
    options in its table. Keys whose value is None (TOML has no null) are left out: None is each such
    key's default, so reading the text back gives the same configuration. `notes` ({table: {key:
    note}}, None for the top level) puts a comment after a key's line, e.g. where its value came from."""
    import tomli_w

    def without_none(table: dict) -> dict:
        return {k: without_none(v) if isinstance(v, dict) else v for k, v in table.items() if v is not None}

    document = without_none(config.to_dict())
    document[config.objective] = document.pop("objective_config")
    text = tomli_w.dumps(document)
    if not any((notes or {}).values()):
        return text
    lines, table = text.splitlines(), None
    for i, line in enumerate(lines):  # a comment after the key's line, in its own table
        if line.startswith("["):
            table = line.strip("[]")
        key = line.split(" = ", 1)[0]
        if key in notes.get(table, {}):
            lines[i] = f"{line}  # {notes[table][key]}"
    return "\n".join(lines) + "\n"


def resolve_config(cli_values: dict[str, Any], toml_path: str | Path | None = None,
                   resume: bool = False) -> TrainConfig:
    """defaults < RUN/run.json (when resuming an existing run) < TOML recipe < command line (`cli_values`:
    the options given, each on the command line or by its variable)."""
    stored: dict[str, Any] = {}
    out = cli_values.get("out")
    record = None
    if resume and out and is_bucket(out):  # a run in a bucket (training/bucket_run.py)
        from jepa_cli.training.bucket_run import read_bucket_run

        record = read_bucket_run(location(out))
    elif resume and out and (Path(out) / "run.json").exists():
        from jepa_cli.training.runfiles import read_run

        record = read_run(out)
    if record is not None:
        stored = dict(record.get("config", {}))
        stored["objective_config"] = {k: v for k, v in stored.get("objective_config", {}).items()
                                      if k != "total_updates"}  # recomputed from the run length
        toml_layer = load_toml(toml_path) if toml_path else {}
        name = cli_values.get("objective") or toml_layer.get("objective") or stored.get("objective")
        if name != stored.get("objective"):
            raise InputError(f"{out}: holds a {stored.get('objective')!r} run, not {name!r}")
        return build_config(merge(stored, toml_layer, cli_values))
    toml_layer = load_toml(toml_path) if toml_path else {}
    values = merge(toml_layer, cli_values)
    if resume and out and not values.get("data"):
        # With --data, --resume of a missing RUN starts it (one command that starts or continues a run,
        # as a requeued cluster job does); without, there is nothing to continue and nothing to start.
        what = "does not exist" if not is_bucket(out) and not os.path.lexists(out) else \
            "holds no run to resume (no run.json)"
        raise InputError(f"{out}: {what}; check the path, or give --data to start a new run there")
    return build_config(values)
