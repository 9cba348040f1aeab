"""`jepa train`."""

from __future__ import annotations

import time

import click

from jepa_cli import options
from jepa_cli.cli.common import emit, format_duration, output_options, warn
from jepa_cli.cli.complete import complete_datasets, complete_recipes, complete_runs
from jepa_cli.errors import InputError, JepaError
from jepa_cli.masks.config import MultiBlockConfig
from jepa_cli.objectives.genconfig import GenerativeConfig
from jepa_cli.objectives.ijepa_config import IJEPAConfig
from jepa_cli.objectives.lejepa_config import LeJEPAConfig

SIGNAL_EXIT = {"SIGINT": 130, "SIGTERM": 143}  # 128 + the signal's number, as for every command
OBJECTIVE_FLAGS = options.flags(IJEPAConfig, MultiBlockConfig, GenerativeConfig, LeJEPAConfig)  # `jepa train`'s objective options
OBJECTIVE_KEYS = frozenset(flag.name for flag in OBJECTIVE_FLAGS)


def _objective_options(func):
    """One option per objective field marked as a flag (jepa_cli/options.py): the model's, the masks'
    and I-JEPA's own (IJEPAConfig, MultiBlockConfig), then the generative objectives'. Defaults are
    None ("not given"): the objective's own default, the recipe and JEPA_TRAIN_* show through."""
    for flag in reversed(OBJECTIVE_FLAGS):
        owner = "/".join(flag.applies) if flag.applies else "ijepa"
        default = f"; default {flag.default_text}" if flag.default is not None else ""
        help_text = f"{flag.help} [{owner}{default}]"
        if flag.kind == "bool":
            negative = "--no-" + flag.flag[2:]
            func = click.option(f"{flag.flag}/{negative}", flag.name, default=None, help=help_text)(func)
            continue
        kind = {"int": int, "float": float}.get(flag.kind) or (NameChoice(flag.choices) if flag.choices
                                                              else OptionText(flag))
        func = click.option(flag.flag, flag.name, type=kind, default=None, help=help_text)(func)
    return func


class OptionText(click.ParamType):
    """A range (LO,HI) or size (S or HxW) option, read by options.parse as its JEPA_TRAIN_ variable is."""

    def __init__(self, flag: options.Flag) -> None:
        self.flag = flag
        self.name = flag.metavar or {"range": "LO,HI", "size": "HxW"}.get(flag.kind, "TEXT")

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            return options.parse(self.flag, value, self.flag.flag)
        except InputError as exc:
            self.fail(str(exc).split(": ", 1)[1], param, ctx)


def _trainer_options(func):
    """One option per trainer key, from its declaration (training/config.py TrainConfig): the flag, the
    type, the help with its default. Every option defaults to None ("not given") so that the recipe
    and JEPA_TRAIN_* layers below it show through."""
    from jepa_cli.training.config import TRAINER_FIELDS

    for field in reversed(TRAINER_FIELDS):
        meta = field.metadata
        rule = meta["rule"]
        flag = meta["flag"] or "--" + field.name.replace("_", "-")
        names = [*meta["aliases"], flag]
        help_text = meta["help"] + (f" [default: {_shown(field.default)}]" if field.default is not None else "")
        if rule.kind == "bool":
            negative = "--no-" + flag[2:]
            func = click.option(f"{flag}/{negative}", field.name, default=None, help=help_text)(func)
            continue
        kind = {"int": int, "float": float}.get(rule.kind, str)
        if rule.choices:
            kind = NameChoice(rule.choices, rule.allow_module)
        func = click.option(*names, field.name, type=kind, default=None, help=help_text,
                            metavar="B1,B2" if rule.kind == "betas" else None,
                            shell_complete=COMPLETERS.get(field.name))(func)
    return func


COMPLETERS = {"data": complete_datasets, "out": complete_runs}  # the shell completes these keys' paths


def _shown(default) -> str:
    if isinstance(default, tuple):
        return ",".join(str(v) for v in default)
    return str(default).lower() if isinstance(default, bool) else str(default)


class NameChoice(click.Choice):
    """A click.Choice (checked before JAX is imported, completed by the shell) that may also take a
    'module:factory' name when the key allows one (an objective outside the package)."""

    def __init__(self, choices, allow_module: bool = False) -> None:
        super().__init__(choices)
        self.allow_module = allow_module

    def convert(self, value, param, ctx):
        if self.allow_module and isinstance(value, str) and ":" in value:
            return value
        return super().convert(value, param, ctx)


@click.command("train")
@_trainer_options
@click.option("--config", "config_path", type=click.Path(), default=None, shell_complete=complete_recipes,
              help="TOML recipe, a path or builtin:NAME (jepa_cli/recipes); JEPA_TRAIN_<KEY> variables override it "
                   "and the command line overrides both.")
@click.option("--print-config", is_flag=True,
              help="Print the resolved configuration as TOML (a recipe that gives the same run.json) and exit.")
@click.option("--resume", is_flag=True, help="Continue RUN from its latest checkpoint.")
@click.option("--force", is_flag=True, help="Replace an existing RUN.")
@click.option("--allow-new-data", is_flag=True,
              help="With --resume: continue RUN on a dataset other than the one it was started on (read from its "
                   "beginning); without it, that is refused.")
@_objective_options
# multi-process
@click.option("--coordinator", default=None, help="ADDR:PORT of process 0 (multi-process launch).")
@click.option("--num-processes", type=int, default=None, help="Number of processes (multi-process launch).")
@click.option("--process-id", type=int, default=None, help="This process's index (multi-process launch).")
@output_options
@click.pass_context
def command(ctx: click.Context, config_path, print_config, resume, force, allow_new_data, coordinator, num_processes,
            process_id, as_json, verbose, quiet, **options) -> int:
    """Pretrain an encoder on a dataset (I-JEPA by default) with the official recipe.

    \b
    Examples:
      jepa train --config builtin:ijepa-digits-tiny --data digits.zarr --out runs/digits
      jepa train --data in1k.zarr --out runs/vith14 --config builtin:ijepa-in1k-vith14 --mesh data=-1,fsdp=8
      jepa train --out runs/digits --data digits.zarr --resume
    """
    from jepa_cli.training.config import parse_text, resolve_config

    if allow_new_data and not resume:
        raise click.UsageError("--allow-new-data goes with --resume (a new run takes any dataset)")
    if options.get("betas") is not None:
        options["betas"] = parse_text("betas", options["betas"], "--betas")
    env_values = _env_values(ctx)
    if print_config:
        from jepa_cli.training.config import to_toml
        from jepa_cli.training.plan import resolved_config

        config, notes = resolved_config(resolve_config(_cli_values(options), config_path, resume=resume,
                                                       env_values=env_values))
        click.echo(to_toml(config, notes), nl=False)
        return 0

    config = resolve_config(_cli_values(options), config_path, resume=resume, env_values=env_values)
    if config.data:  # a missing or damaged dataset is refused before JAX loads (seconds)
        from jepa_cli.data.trainable import check_dataset

        check_dataset(config.data)

    from jepa_cli.training import distributed

    distributed.initialize(coordinator, num_processes, process_id)

    from jepa_cli.training.loop import Callbacks, train

    import jax

    from jepa_cli.cli.common import live_progress
    from jepa_cli.evaluation.online import training_probe
    from jepa_cli.evaluation.quality import training_quality

    main = jax.process_index() == 0
    silent = quiet or not main
    with live_progress(*TrainProgress.columns(), quiet=silent) as progress:
        shown = TrainProgress(progress, config.log_every, config.batch_size, quiet=silent)
        callbacks = Callbacks(on_start=shown.on_start, on_step=shown.on_step, on_probe=shown.on_probe, on_log=shown.log,
                              on_warning=lambda message: warn(message, silent),
                              on_checkpoint=(lambda s: shown.log(f"checkpoint {s}")) if verbose else (lambda s: None))
        summary = train(config, callbacks=callbacks, resume=resume, force=force, allow_new_data=allow_new_data,
                        make_probe=training_probe, make_quality=training_quality)
    if main:
        result = {k: summary.get(k) for k in ("run", "step", "loss", "steps", "objective", "checkpoints")}
        result.update({k: v for k, v in (summary.get("last_metrics") or {}).items() if k not in result})
        if summary.get("interrupted"):
            result["interrupted"] = summary["interrupted"]
        if summary.get("probe"):
            result["probe"] = summary["probe"]
        if summary.get("collapse_suspected_at"):
            result["collapse_suspected_at"] = summary["collapse_suspected_at"]
        emit(result, as_json)
    signal_name = summary.get("interrupted")
    if signal_name:
        raise StoppedBySignal(signal_name, summary)
    return 0


def _cli_values(options_given: dict) -> dict:
    """The command line's layer of the configuration: the trainer keys given, and the objective's
    options in objective_config (None: not given)."""
    values = {k: v for k, v in options_given.items() if v is not None and k not in OBJECTIVE_KEYS}
    values["objective_config"] = {k: v for k, v in options_given.items() if v is not None and k in OBJECTIVE_KEYS}
    return values


def _env_values(ctx: click.Context) -> dict:
    """The environment's layer (between the recipe and the command line): trainer keys from
    JEPA_TRAIN_<KEY> (training/config.py env_layer) and the objective's options from
    JEPA_TRAIN_<OPTION>, read as on the command line (options.parse)."""
    import os

    from jepa_cli.training.config import ENV_PREFIX, TRAINER_KEYS, env_layer, merge

    values = env_layer(dict(os.environ), frozenset(p.name for p in ctx.command.params if p.name not in TRAINER_KEYS))
    objective_config = {}
    for flag in OBJECTIVE_FLAGS:
        variable = ENV_PREFIX + flag.name.upper()
        text = os.environ.get(variable, "")
        if text:
            objective_config[flag.name] = options.parse(flag, text, variable)
    return merge(values, {"objective_config": objective_config})


class TrainProgress:
    """`jepa train`'s progress on stderr, drawn by common.live_progress: on a terminal a bar with the
    loss, the learning rate, a collapse metric (the target features' effective rank, or their std),
    examples/s, the last k-NN score and the time left; elsewhere (SLURM, nohup, 2>file) one plain line
    every `log_every` updates and, between them, within PLAIN_FIRST_S of the first update and then at
    least every PLAIN_EVERY_S (common.PlainThrottle): a slow run says its pace from the first minute.
    The rate and the time left are timed from the first update's report, so that compiling the step
    does not count. A run with no update to make (`--steps 0`) draws no bar."""

    PLAIN_FIRST_S = 30.0
    PLAIN_EVERY_S = 60.0

    @staticmethod
    def columns() -> list:
        """The bar's columns (live_progress)."""
        from rich.progress import BarColumn, MofNCompleteColumn

        return ["[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                "loss {task.fields[loss]}", "{task.fields[lr]}", "{task.fields[collapse]}", "{task.fields[rate]}",
                "{task.fields[knn]}", "{task.fields[eta]}"]

    def __init__(self, progress, log_every: int, batch_size: int, quiet: bool = False) -> None:
        from jepa_cli.cli.common import stderr_log

        self.progress, self.log_every, self.batch_size = progress, log_every, batch_size
        self.plain = not quiet and not progress.console.is_terminal
        self.log = stderr_log(quiet, progress.console)  # a line above the bar
        self.task = None
        self.steps = 0
        self.first: tuple[int, float] | None = None  # (step, time) of the first report: the clock's start
        self.previous: float | None = None  # time of the last report (the bar's examples/s)
        self.line: tuple[int, float] | None = None  # (step, time) of the last plain line
        self.lines = None  # the plain lines' common.PlainThrottle, started at the first report

    def on_start(self, info: dict) -> None:
        self.log(f"run {info['run']}: steps {info['start_step']} -> {info['steps']}, mesh {info['mesh']}, "
                 f"{info['devices']} devices, {info['processes']} process(es)")
        self.steps = info["steps"]
        if info["steps"] > info["start_step"]:  # added once validation passed: a refusal leaves its line alone
            self.task = self.progress.add_task("train", total=info["steps"], completed=info["start_step"], loss="-",
                                               lr="", collapse="", rate="", knn="", eta="")

    def on_step(self, metrics: dict) -> None:
        now, step = time.perf_counter(), metrics["step"]
        if self.first is None:
            from jepa_cli.cli.common import PlainThrottle

            self.first = self.line = (step, now)
            self.lines = PlainThrottle(now, self.PLAIN_FIRST_S, self.PLAIN_EVERY_S)
        rate = f"{self.batch_size / max(now - self.previous, 1e-9):,.0f} ex/s" if self.previous is not None else ""
        self.previous = now
        if self.task is not None:
            loss = metrics.get("loss")
            eta = self.eta(step, now)
            self.progress.update(self.task, completed=step, loss=f"{loss:.4f}" if loss is not None else "nan",
                                 lr=f"lr {metrics['lr']:.2e}" if metrics.get("lr") is not None else "",
                                 collapse=collapse_text(metrics), rate=rate,
                                 eta=f"ETA {format_duration(eta)}" if eta is not None else "")
        timed = step - self.first[0]
        pace = (now - self.first[1]) / timed if timed > 0 else 0.0  # seconds per update so far
        if self.plain and self.lines.due(now, step % self.log_every == 0 or step == self.steps, pace):
            done, seconds = step - self.line[0], now - self.line[1]
            self.log(plain_step_line(metrics, self.steps, done, seconds, self.batch_size))
            self.line = (step, now)  # the next line's rate covers the updates since this one
            self.lines.wrote(now)

    def on_probe(self, row: dict) -> None:
        from jepa_cli.evaluation.features import accuracy_text

        when = "the initialisation" if row["step"] == 0 else f"{row['probe_seconds']:.1f} s"
        self.log(f"step {row['step']}: k-NN {accuracy_text(row['knn_top1'], row['knn_top5'])} ({when})")
        if self.task is not None:
            self.progress.update(self.task, knn=f"k-NN {row['knn_top1']:.3f}")

    def eta(self, step: int, now: float) -> float | None:
        """Seconds left at `step`, from the mean time per update since the first report; None before
        a second report."""
        from jepa_cli.cli.common import seconds_left

        return seconds_left(self.first, step, self.steps, now)


def collapse_text(metrics: dict) -> str:
    """What the bar shows of a collapse: `rank 12.3` (the target features' effective rank), else
    `std 0.0123` (target_std, else repr_std); empty when the objective reports none."""
    if metrics.get("effective_rank") is not None:
        return f"rank {metrics['effective_rank']:.1f}"
    std = metrics.get("target_std", metrics.get("repr_std"))
    return f"std {std:.3g}" if std is not None else ""


def plain_step_line(metrics: dict, steps: int, done: int, elapsed_s: float, batch_size: int) -> str:
    """One log line of a training step for a non-terminal stderr:
    `step 120/500 loss 0.1234 lr 4.10e-04 312 ex/s ETA 1m23s`, the rate and ETA from the last `done`
    updates, which took `elapsed_s` (none on a line with no update timed before it)."""
    step = metrics["step"]
    parts = [f"step {step}/{steps}"]
    if metrics.get("loss") is not None:
        parts.append(f"loss {metrics['loss']:.4f}")
    if metrics.get("lr") is not None:
        parts.append(f"lr {metrics['lr']:.2e}")
    if done > 0 and elapsed_s > 0:
        per_update = elapsed_s / done
        parts.append(f"{batch_size / per_update:,.0f} ex/s")
        parts.append(f"ETA {format_duration((steps - step) * per_update)}")
    return " ".join(parts)


class StoppedBySignal(JepaError):
    """Training stopped by SIGINT/SIGTERM after saving: the result is printed, then one error line
    (as any command stopped by a signal) and exit 130/143."""

    def __init__(self, signal_name: str, summary: dict) -> None:
        what = "terminated" if signal_name == "SIGTERM" else "interrupted"
        super().__init__(f"{what} ({signal_name}): saved step {summary.get('step')} in {summary.get('run')}; "
                         "continue with --resume")
        self.exit_code = SIGNAL_EXIT[signal_name]


def _read_env_one_layer_down(cmd: click.Command) -> None:
    """The trainer keys and the objective's options are read from JEPA_TRAIN_* by _env_values, below the
    command line; click's own JEPA_<COMMAND>_<OPTION> reading (cli/main.py) is off for them. Every other
    option of train keeps it.

    Click's reading would keep the order (it hands a variable's value over as if typed, and a typed
    option still wins) but not the rest: its error for a bad value names the option instead of the
    variable, and a misspelt JEPA_TRAIN_ variable passes unnoticed (click looks up only the names it
    knows), where env_layer refuses it in one line naming it."""
    from jepa_cli.training.config import TRAINER_KEYS

    for param in cmd.params:
        if param.name in TRAINER_KEYS or param.name in OBJECTIVE_KEYS:
            param.allow_from_autoenv = False


_read_env_one_layer_down(command)
