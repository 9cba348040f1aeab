"""`jepa train`."""

from __future__ import annotations

import time

import click

from jepa_cli import options
from jepa_cli.cli.common import emit, format_duration, output_options, warn
from jepa_cli.cli.complete import complete_datasets, complete_recipes, complete_runs
from jepa_cli.cli.declared import declared_option
from jepa_cli.errors import JepaError
from jepa_cli.masks.config import MultiBlockConfig
from jepa_cli.objectives.genconfig import GenerativeConfig
from jepa_cli.objectives.ijepa_config import IJEPAConfig
from jepa_cli.objectives.lejepa_config import LeJEPAConfig
from jepa_cli.training.config import TRAINER_FLAGS

SIGNAL_EXIT = {"SIGINT": 130, "SIGTERM": 143}  # 128 + the signal's number, as for every command
OBJECTIVE_FLAGS = options.flags(IJEPAConfig, MultiBlockConfig, GenerativeConfig, LeJEPAConfig)  # `jepa train`'s objective options
OBJECTIVE_KEYS = frozenset(flag.name for flag in OBJECTIVE_FLAGS)


def _declared_options(declared: list[options.Flag]):
    """One option per declared key (jepa_cli/options.py): the trainer's (TrainConfig) or the objectives'
    fields marked as flags (the model's, the masks', I-JEPA's, the generative objectives' and LeJEPA's).
    Defaults are None ("not given"): the recipe's value and the objective's own default show through;
    the help shows the declared default, and for an objective option the objectives that read it."""

    def decorate(func):
        for flag in reversed(declared):
            default = flag.default_text
            if flag.name in TRAINER_FLAGS:
                help_text = flag.help + (f" [default: {default}]" if default is not None else "")
            else:
                owner = "/".join(flag.applies) if flag.applies else "ijepa"
                help_text = f"{flag.help} [{owner}{f'; default {default}' if default is not None else ''}]"
            func = declared_option(flag, help_text, shell_complete=COMPLETERS.get(flag.name))(func)
        return func

    return decorate


COMPLETERS = {"data": complete_datasets, "out": complete_runs}  # the shell completes these keys' paths


@click.command("train")
@_declared_options(list(TRAINER_FLAGS.values()))
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
@_declared_options(OBJECTIVE_FLAGS)
# multi-process
@click.option("--coordinator", default=None, help="ADDR:PORT of process 0 (multi-process launch).")
@click.option("--num-processes", type=int, default=None, help="Number of processes (multi-process launch).")
@click.option("--process-id", type=int, default=None, help="This process's index (multi-process launch).")
@output_options
def command(config_path, print_config, resume, force, allow_new_data, coordinator, num_processes,
            process_id, as_json, verbose, quiet, **options) -> int:
    """Pretrain an encoder on a dataset (I-JEPA by default) with the official recipe.

    \b
    Examples:
      jepa train --config builtin:ijepa-digits-tiny --data digits.zarr --out runs/digits
      jepa train --data in1k.zarr --out runs/vith14 --config builtin:ijepa-in1k-vith14 --mesh data=-1,fsdp=8
      jepa train --out runs/digits --data digits.zarr --resume
    """
    from jepa_cli.training.config import resolve_config

    if allow_new_data and not resume:
        raise click.UsageError("--allow-new-data goes with --resume (a new run takes any dataset)")
    if print_config:
        from jepa_cli.training.config import to_toml
        from jepa_cli.training.plan import resolved_config

        config, notes = resolved_config(resolve_config(_cli_values(options), config_path, resume=resume))
        click.echo(to_toml(config, notes), nl=False)
        return 0

    config = resolve_config(_cli_values(options), config_path, resume=resume)
    if config.out:  # a malformed run URL is refused before the dataset is asked for
        from jepa_cli.training.plan import check_run_location

        check_run_location(config.out)
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
