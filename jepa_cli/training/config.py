"""The trainer's configuration: defaults < RUN/run.json (on --resume) < TOML recipe < JEPA_TRAIN_*
environment variables < command line. Each trainer key is declared once, as a TrainConfig field.

A TOML recipe holds trainer keys at the top level and the objective's options in a table named
after the objective (`[ijepa]`); any other key is an InputError naming it. The resolved
configuration is saved in RUN/run.json and in every checkpoint.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from pathlib import Path
from typing import Any

from jepa_cli.errors import InputError
from jepa_cli.fieldtypes import BOOL_WORDS
from jepa_cli.names import OBJECTIVE_NAMES


# The optimizer and the schedules count updates in int32 (training/optimizer.py): a run is at most this long.
MAX_UPDATES = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class _Rule:
    """What a trainer key accepts: kind 'int' | 'float' | 'str' | 'bool' | 'betas', a range or a set of
    choices, None or not.

    The objective options are checked another way (fieldtypes.check_field_types against the field's
    annotation, ranges in each config class's __post_init__), and the two stay apart: a trainer key's
    rule holds what an annotation cannot (a range such as lr > 0, 'module:factory' beside the
    choices, the betas pair) and its message names the key as the user wrote it (`--batch-size`,
    `recipe.toml: batch_size`, `JEPA_TRAIN_BATCH_SIZE`), where an objective option's names its owner
    (`ijepa option depth`). Text is read with the same words in both (fieldtypes.BOOL_WORDS)."""

    kind: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself is excluded (lr > 0)
    nullable: bool = False  # None means "not set" (run.json stores it as null)
    choices: tuple[str, ...] | None = None
    allow_module: bool = False  # a choice, or 'module:factory' (an objective outside the package)

    def describe(self) -> str:
        if self.kind == "betas":
            return "two numbers in [0, 1) such as [0.9, 0.999]"
        if self.choices:
            return "one of " + ", ".join(self.choices) + (" or module:factory" if self.allow_module else "")
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
            return isinstance(value, {"str": str, "bool": bool}[self.kind]) and (
                not self.choices or value in self.choices or (self.allow_module and ":" in value))
        if not (_is_number(value) and (self.kind == "float" or isinstance(value, int))):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or value <= self.high


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _key(default: Any, rule: _Rule, help: str, flag: str | None = None, aliases: tuple[str, ...] = ()) -> Any:
    """One trainer key, declared once: its default, what it accepts and its help. From this come the
    `jepa train` option (`flag`, by default `--` and the key with dashes, plus `aliases`), the TOML key,
    the JEPA_TRAIN_<KEY> variable, the run.json entry and the `--help` text with its default."""
    return dataclasses.field(default=default, metadata={"rule": rule, "help": help, "flag": flag, "aliases": aliases})


@dataclasses.dataclass
class TrainConfig:
    objective: str = _key("ijepa", _Rule("str", choices=OBJECTIVE_NAMES, allow_module=True),
                          "What is learned: ijepa | vjepa (video) | audio-jepa | flow | diffusion | lejepa.")
    data: str | None = _key(None, _Rule("str", nullable=True), "Dataset directory (zarr v3, from jepa ingest).")
    out: str | None = _key(None, _Rule("str", nullable=True),
                           "Run directory (checkpoints, metrics.jsonl, run.json).", flag="--output",
                           aliases=("-o", "--out"))
    # length: --steps wins over --epochs; epochs use ipe = num_samples // batch_size
    steps: int | None = _key(None, _Rule("int", 0, MAX_UPDATES, nullable=True),
                             "Optimizer updates in the run (wins over --epochs; 0 writes the initial weights).")
    epochs: float | None = _key(None, _Rule("float", 0, nullable=True),
                                "Epochs; one epoch is num_samples // batch_size updates.")
    batch_size: int = _key(64, _Rule("int", 1), "Global examples per optimizer update.")
    grad_accum: int = _key(1, _Rule("int", 1), "Split each batch into K micro-batches (one update).")
    mesh: str = _key("data=-1,fsdp=1", _Rule("str"), "Device mesh, e.g. data=-1,fsdp=1 (-1 takes the rest).")
    device_normalise: bool = _key(False, _Rule("bool"),
                                  "Send the resized pixels to the device as uint8 and normalise them in the "
                                  "train step: a quarter of the bytes per batch, the same float32 numbers to "
                                  "one rounding (ijepa, vjepa).")
    seed: int = _key(0, _Rule("int", 0, 2**32 - 1),  # what numpy and jax.random.PRNGKey accept
                     "Seed of initialisation, data order and masks.")
    # optimizer and schedules (official I-JEPA defaults, configs/in1k_vith14_ep300.yaml)
    lr: float = _key(1e-3, _Rule("float", 0, low_open=True), "Peak learning rate (after the linear warmup).")
    start_lr: float = _key(2e-4, _Rule("float", 0), "Learning rate at the start of the warmup.")
    final_lr: float = _key(1e-6, _Rule("float", 0), "Learning rate at the end of the cosine decay.")
    warmup_steps: int | None = _key(None, _Rule("int", 0, MAX_UPDATES, nullable=True),
                                    "Warmup in updates (wins over --warmup-epochs; default 40/300 of the run).")
    warmup_epochs: float | None = _key(None, _Rule("float", 0, nullable=True), "Warmup in epochs.")
    wd: float = _key(0.04, _Rule("float", 0), "Weight decay at the start (cosine ramp to --final-wd).")
    final_wd: float = _key(0.4, _Rule("float", 0), "Weight decay at the end.")
    ipe_scale: float = _key(1.0, _Rule("float", 0, low_open=True),
                            "Schedules run over steps x ipe_scale (official 1.0).")
    # the EMA ramp on its own length: Audio-JEPA ramps over 50 epochs' updates while it stops at 100k updates
    ema_ramp_steps: int | None = _key(None, _Rule("int", 1, MAX_UPDATES, nullable=True),
                                      "EMA momentum ramp length in updates (wins over --ema-ramp-epochs; default: "
                                      "the run's steps x ipe_scale).")
    ema_ramp_epochs: float | None = _key(None, _Rule("float", 0, low_open=True, nullable=True),
                                         "EMA momentum ramp length in epochs (num_samples // batch_size updates each).")
    clip_grad: float | None = _key(None, _Rule("float", 0, low_open=True, nullable=True),
                                   "Clip the global gradient norm to this value (default: no clipping).")
    clip_grad_start: int = _key(0, _Rule("int", 0),  # V-JEPA clips only once epoch > warmup
                                "First update that clips.")
    betas: tuple[float, float] = _key((0.9, 0.999), _Rule("betas"), "AdamW betas B1,B2.")
    # checkpoints and logging
    save_every: int | None = _key(None, _Rule("int", 1, nullable=True),
                                  "Checkpoint every N updates (always at the end and on SIGINT/SIGTERM).")
    keep: int | None = _key(3, _Rule("int", 0, nullable=True), "Keep the K most recent checkpoints (0: all).")
    async_checkpointing: bool = _key(True, _Rule("bool"),
                                     "Write checkpoints in the background while training goes on.")
    log_every: int = _key(1, _Rule("int", 1),
                          "Write metrics.jsonl (and a plain log line when stderr is not a terminal) every N updates.")
    collapse_threshold: float = _key(1e-4, _Rule("float", 0), "Warn when repr_std or target_std falls below this.")
    collapse_rank_fraction: float = _key(0.7, _Rule("float", 0, 1),
                                         "Warn when effective_rank falls below this fraction of its peak.")
    tensorboard: str | None = _key(None, _Rule("str", nullable=True),
                                   "Also write every logged metric as TensorBoard events into this folder "
                                   "(the tensorboard extra; metrics.jsonl stays the record).")
    wandb: str | None = _key(None, _Rule("str", nullable=True),
                             "Also log every metric to this Weights & Biases project (the wandb extra; set "
                             "WANDB_MODE=offline without network; metrics.jsonl stays the record).")
    num_threads: int = _key(2, _Rule("int", 1), "Reader threads of the input pipeline.")
    # the k-NN probe of the target encoder during training (evaluation/online.py)
    probe_every: int | None = _key(None, _Rule("int", 1, nullable=True),
                                   "Score the target encoder with a k-NN probe every N updates (and at step 0); "
                                   "needs --probe-data.")
    probe_data: str | None = _key(None, _Rule("str", nullable=True),
                                  "TRAIN.zarr,TEST.zarr: the labelled datasets of --probe-every (kept in memory).")
    probe_k: int = _key(20, _Rule("int", 1),  # DINO's k-NN protocol; `jepa probe knn --k`
                        "Neighbours of the training-time k-NN probe.")
    # the label-free figure of the target encoder (evaluation/quality.py)
    quality_batch: int = _key(256, _Rule("int", 0),
                              "Log sigreg_quality every --log-every updates: SIGReg of the target encoder's pooled "
                              "features of the first N training examples (fewer if the dataset is smaller), "
                              "on fixed directions; 0 turns it off.")
    # the objective's own options (IJEPAConfig fields, mask options), as resolved by the objective
    objective_config: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d


ENV_PREFIX = "JEPA_TRAIN_"  # JEPA_TRAIN_BATCH_SIZE=256 sets batch_size (between the recipe and the command line)

TRAINER_FIELDS = tuple(f for f in dataclasses.fields(TrainConfig) if f.name != "objective_config")
TRAINER_KEYS = {f.name for f in TRAINER_FIELDS}
RULES: dict[str, _Rule] = {f.name: f.metadata["rule"] for f in TRAINER_FIELDS}


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




def check_value(key: str, value: Any, name: str) -> None:
    """InputError `NAME must be <what KEY accepts>, got VALUE` unless `value` fits; `name` is how the
    user wrote the key (`--batch-size`, or `recipe.toml: batch_size`)."""
    rule = RULES[key]
    if not rule.accepts(value):
        raise InputError(f"{name} must be {rule.describe()}, got {value!r}")


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


def env_layer(environ: dict[str, str], other_options: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The trainer keys set by JEPA_TRAIN_<KEY> variables (JEPA_TRAIN_BATCH_SIZE=256, JEPA_TRAIN_BETAS=0.9,0.95,
    JEPA_TRAIN_ASYNC_CHECKPOINTING=false); an empty value is not set. A JEPA_TRAIN_ variable that names
    neither a key nor one of `other_options` (the command's other options, read elsewhere), or a value of
    the wrong type, is an InputError naming the variable."""
    out: dict[str, Any] = {}
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or environ[name] == "":
            continue
        key = name[len(ENV_PREFIX):].lower()
        if key in other_options:
            continue
        if key not in TRAINER_KEYS:
            raise InputError(f"{name}: no such trainer key (the JEPA_TRAIN_ variables are "
                             f"{ENV_PREFIX}<KEY> for the keys of `jepa train --help`)")
        out[key] = parse_text(key, environ[name], name)
    return out


def parse_text(key: str, text: str, name: str) -> Any:
    """A trainer key's value from its text (an environment variable or a command-line word): checked
    as check_value does, so every source gives the same message."""
    rule = RULES[key]
    value: Any = text
    try:
        if rule.kind == "int":
            value = int(text)
        elif rule.kind == "float":
            value = float(text)
        elif rule.kind == "bool":
            value = BOOL_WORDS[text.lower()]
        elif rule.kind == "betas":
            value = [float(b) for b in text.replace(" ", "").split(",")]
    except (ValueError, KeyError):
        raise InputError(f"{name} must be {rule.describe()}, got {text!r}") from None
    check_value(key, value, name)
    return value


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


def resolve_config(cli_values: dict[str, Any], toml_path: str | Path | None = None, resume: bool = False,
                   env_values: dict[str, Any] | None = None) -> TrainConfig:
    """defaults < RUN/run.json (when resuming an existing run) < TOML recipe < environment (`env_values`:
    env_layer's trainer keys, and the objective's options from JEPA_TRAIN_<OPTION>) < command line."""
    env_values = env_values or {}
    stored: dict[str, Any] = {}
    out = cli_values.get("out")
    if resume and out and (Path(out) / "run.json").exists():
        from jepa_cli.training.runfiles import read_run

        record = read_run(out)
        stored = dict(record.get("config", {}))
        stored["objective_config"] = {k: v for k, v in stored.get("objective_config", {}).items()
                                      if k != "total_updates"}  # recomputed from the run length
        toml_layer = load_toml(toml_path) if toml_path else {}
        name = cli_values.get("objective") or env_values.get("objective") or toml_layer.get("objective") \
            or stored.get("objective")
        if name != stored.get("objective"):
            raise InputError(f"{out}: holds a {stored.get('objective')!r} run, not {name!r}")
        return build_config(merge(stored, toml_layer, env_values, cli_values))
    toml_layer = load_toml(toml_path) if toml_path else {}
    values = merge(toml_layer, env_values, cli_values)
    if resume and out and not values.get("data"):
        # With --data, --resume of a missing RUN starts it (one command that starts or continues a run,
        # as a requeued cluster job does); without, there is nothing to continue and nothing to start.
        what = "does not exist" if not os.path.lexists(out) else "holds no run to resume (no run.json)"
        raise InputError(f"{out}: {what}; check the path, or give --data to start a new run there")
    return build_config(values)
