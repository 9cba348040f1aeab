"""`jepa train`."""

from __future__ import annotations

import time

import click

from jepa_cli.cli.common import emit, output_options, parse_hxw
from jepa_cli.cli.complete import complete_datasets, complete_recipes, complete_runs
from jepa_cli.errors import InputError, JepaError
from jepa_cli.names import COMPUTE_DTYPES, LOSSES, MODEL_NAMES, REMAT_POLICIES
from jepa_cli.objectives.genconfig import train_flags

SIGNAL_EXIT = {"SIGINT": 130, "SIGTERM": 143}  # 128 + the signal's number, as for every command


def _pair(value: str | None, option: str):
    if value is None:
        return None
    try:
        parts = [float(p) for p in value.replace(" ", "").split(",")]
    except ValueError:
        raise click.BadParameter(f"expected LO,HI such as 0.15,0.2, got {value!r}", param_hint=option) from None
    if len(parts) != 2:
        raise click.BadParameter(f"expected LO,HI such as 0.15,0.2, got {value!r}", param_hint=option)
    return parts


def _generative_options(func):
    """The flow / diffusion options that are flags: from their one declaration (objectives/genconfig.py)."""
    for name, flag, kind, help_text in reversed(train_flags()):
        func = click.option(flag, name, type=kind, default=None, help=help_text)(func)
    return func


GENERATIVE_KEYS = tuple(name for name, *_ in train_flags())


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
@click.option("--model", type=click.Choice(MODEL_NAMES), default=None, help="Encoder size.")
@click.option("--patch-size", type=int, default=None, help="Patch size in pixels.")
@click.option("--image-size", default=None, help="Training crop size, S or HxW (default: the dataset's).")
@click.option("--pred-depth", type=int, default=None, help="Predictor depth.")
@click.option("--pred-width", type=int, default=None, help="Predictor width.")
@click.option("--loss", type=click.Choice(LOSSES), default=None, help="smooth_l1 (official code) | l2 (paper) | l1.")
@click.option("--dtype", type=click.Choice(COMPUTE_DTYPES), default=None,
              help="Compute dtype (parameters stay float32).")
@click.option("--scan-layers/--no-scan-layers", default=None,
              help="Run the blocks under lax.scan: compile time no longer grows with depth.")
@click.option("--remat", type=click.Choice(REMAT_POLICIES), default=None,
              help="Activation checkpointing per block: keep matmul outputs (dots) or only block inputs (block).")
@click.option("--resume", is_flag=True, help="Continue RUN from its latest checkpoint.")
@click.option("--force", is_flag=True, help="Replace an existing RUN.")
# masks (the options of `jepa mask`; defaults: the objective's official ones)
@click.option("--npred", type=int, default=None, help="Target blocks per image (official 4).")
@click.option("--pred-scale", default=None, help="Target block scale LO,HI (official 0.15,0.2).")
@click.option("--aspect", default=None, help="Target block aspect LO,HI (official 0.75,1.5).")
@click.option("--enc-scale", default=None, help="Context block scale LO,HI (official 0.85,1.0).")
@click.option("--min-keep", type=int, default=None, help="Minimum context tokens (official 10).")
@click.option("--allow-overlap", is_flag=True, default=None, help="Let the context overlap the targets.")
@click.option("--context-size", type=int, default=None, help="Context slots K (default: derived).")
@click.option("--official-positions", is_flag=True, default=None,
              help="Block positions as the official code (last row/column never reached).")
@click.option("--official-truncation", is_flag=True, default=None,
              help="Cut masks to the batch minimum as the official collator.")
@click.option("--collator-batch", type=int, default=None,
              help="With --official-truncation: the cut runs over groups of this many examples (the official "
                   "per-GPU batch, 128 in in1k_vith14); default the whole batch.")
# generative objectives (flow, diffusion)
@_generative_options
# multi-process
@click.option("--coordinator", default=None, help="ADDR:PORT of process 0 (multi-process launch).")
@click.option("--num-processes", type=int, default=None, help="Number of processes (multi-process launch).")
@click.option("--process-id", type=int, default=None, help="This process's index (multi-process launch).")
@output_options
@click.pass_context
def command(ctx: click.Context, config_path, print_config, resume, force, coordinator, num_processes, process_id,
            as_json, verbose, quiet, **options) -> int:
    """Pretrain an encoder on a dataset (I-JEPA by default) with the official recipe.

    \b
    Examples:
      jepa train --config builtin:ijepa-digits-tiny --data digits.zarr --out runs/digits
      jepa train --data in1k.zarr --out runs/vith14 --config builtin:ijepa-in1k-vith14 --mesh data=-1,fsdp=8
      jepa train --out runs/digits --data digits.zarr --resume
    """
    from jepa_cli.training.config import parse_text, resolve_config

    if options.get("betas") is not None:
        options["betas"] = parse_text("betas", options["betas"], "--betas")
    env_values = _env_values(ctx)
    if print_config:
        from jepa_cli.training.config import to_toml
        from jepa_cli.training.loop import resolved_config

        config = resolve_config(_cli_values(options), config_path, resume=resume, env_values=env_values)
        click.echo(to_toml(resolved_config(config)), nl=False)
        return 0

    from jepa_cli.training import distributed

    distributed.initialize(coordinator, num_processes, process_id)

    from jepa_cli.training.loop import Callbacks, train

    config = resolve_config(_cli_values(options), config_path, resume=resume, env_values=env_values)

    import jax

    main = jax.process_index() == 0
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from jepa_cli.cli.common import stderr_console, stderr_log

    console = stderr_console(quiet or not main)
    plain = not console.is_terminal  # SLURM, nohup, 2>file: one plain line every log_every updates, no bar
    log = stderr_log(quiet or not main, console)
    progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[rate]}"),
                        TextColumn("{task.fields[knn]}"), TimeRemainingColumn(), console=console,
                        disable=quiet or not main or plain)
    task = {}

    def on_start(info):
        log(f"run {info['run']}: steps {info['start_step']} -> {info['steps']}, mesh {info['mesh']}, "
            f"{info['devices']} devices, {info['processes']} process(es)")
        task["id"] = progress.add_task("train", total=info["steps"], completed=info["start_step"], loss="-", rate="",
                                      knn="")
        progress.start()  # only once validation passed: a refusal prints its one error line and nothing else
        task.update(t=None, steps=info["steps"], line_step=info["start_step"], line_t=time.perf_counter())

    def on_step(m):
        now = time.perf_counter()
        rate = ""
        if task.get("t") is not None:
            rate = f"{config.batch_size / max(now - task['t'], 1e-9):,.0f} ex/s"
        task["t"] = now
        loss = m.get("loss")
        progress.update(task["id"], completed=m["step"], loss=f"{loss:.4f}" if loss is not None else "nan", rate=rate)
        if m.get("knn_top1") is not None:  # a training-time probe ran at this step
            progress.update(task["id"], knn=f"k-NN {m['knn_top1']:.3f}")
            log(f"step {m['step']}: k-NN top-1 {m['knn_top1']:.4f}, top-5 {m['knn_top5']:.4f} "
                f"({m['probe_seconds']:.1f} s)")
        if plain and (m["step"] % config.log_every == 0 or m["step"] == task["steps"]):
            done, seconds = m["step"] - task["line_step"], now - task["line_t"]
            log(plain_step_line(m, task["steps"], done, seconds, config.batch_size))
            task.update(line_step=m["step"], line_t=now)  # the next line's rate covers the updates since this one

    callbacks = Callbacks(on_start=on_start, on_step=on_step, on_log=log,
                          on_checkpoint=(lambda s: log(f"checkpoint {s}")) if verbose else (lambda s: None))
    try:
        summary = train(config, callbacks=callbacks, resume=resume, force=force)
    finally:
        progress.stop()
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


OBJECTIVE_KEYS = ("model", "patch_size", "pred_depth", "pred_width", "loss", "dtype", "scan_layers", "remat", "npred",
                  "min_keep", "allow_overlap", "context_size", "official_positions", "official_truncation",
                  "collator_batch") + GENERATIVE_KEYS
_OBJECTIVE_OPTIONS = OBJECTIVE_KEYS + ("image_size", "pred_scale", "aspect", "enc_scale")


def _cli_values(options: dict) -> dict:
    """The command line's layer of the configuration: the trainer keys given, and the objective's
    options in objective_config (None: not given)."""
    options = dict(options)
    objective_config = {k: options.pop(k) for k in OBJECTIVE_KEYS}
    image_size = parse_hxw(options.pop("image_size"), "--image-size")
    if image_size is not None:
        objective_config["image_size"] = image_size[0] if image_size[0] == image_size[1] else list(image_size)
    for key in ("pred_scale", "aspect", "enc_scale"):
        objective_config[key] = _pair(options.pop(key), "--" + key.replace("_", "-"))
    values = {k: v for k, v in options.items() if v is not None}
    values["objective_config"] = {k: v for k, v in objective_config.items() if v is not None}
    return values


def _env_values(ctx: click.Context) -> dict:
    """The environment's layer (between the recipe and the command line): trainer keys from
    JEPA_TRAIN_<KEY> (training/config.py env_layer) and the objective's options from JEPA_TRAIN_<OPTION>,
    typed and checked by their click option as on the command line."""
    import os

    from jepa_cli.training.config import ENV_PREFIX, TRAINER_KEYS, env_layer, merge

    values = env_layer(dict(os.environ), frozenset(p.name for p in ctx.command.params if p.name not in TRAINER_KEYS))
    options = dict.fromkeys(_OBJECTIVE_OPTIONS)
    for param in ctx.command.params:
        text = os.environ.get(ENV_PREFIX + param.name.upper(), "") if param.name in _OBJECTIVE_OPTIONS else ""
        if text:
            try:
                options[param.name] = param.type_cast_value(ctx, text)
            except click.BadParameter as exc:
                raise InputError(f"{ENV_PREFIX}{param.name.upper()}: {exc.message}") from None
    try:
        objective_config = _cli_values(options)["objective_config"]
    except click.BadParameter as exc:  # name the variable the value came from, not the option
        variable = ENV_PREFIX + str(exc.param_hint).lstrip("-").replace("-", "_").upper()
        raise InputError(f"{variable}: {exc.message}") from None
    return merge(values, {"objective_config": objective_config})


def plain_step_line(metrics: dict, steps: int, done: int, elapsed_s: float, batch_size: int) -> str:
    """One log line of a training step for a non-terminal stderr:
    `step 120/500 loss 0.1234 lr 4.10e-04 312 ex/s ETA 1m23s`, the rate and ETA from the last `done`
    updates, which took `elapsed_s`."""
    from jepa_cli.cli.common import format_duration

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
    command line; click's own JEPA_<COMMAND>_<OPTION> reading (cli/main.py) would put them above the
    recipe's, so it is off for them. Every other option of train keeps it."""
    from jepa_cli.training.config import TRAINER_KEYS

    for param in cmd.params:
        if param.name in TRAINER_KEYS or param.name in _OBJECTIVE_OPTIONS:
            param.allow_from_autoenv = False


_read_env_one_layer_down(command)
