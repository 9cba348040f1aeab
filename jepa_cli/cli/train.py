"""`jepa train`."""

from __future__ import annotations

import click

from jepa_cli.cli.common import SEED, emit, output_options, parse_hxw
from jepa_cli.errors import JepaError
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


@click.command("train")
@click.option("--objective", default=None,
              help="What is learned: ijepa (default) | vjepa (video) | audio-jepa | flow | diffusion.")
@click.option("--data", type=click.Path(), default=None, help="Dataset directory (zarr v3, from jepa ingest).")
@click.option("--out", type=click.Path(), default=None, help="Run directory (checkpoints, metrics.jsonl, run.json).")
@click.option("--config", "config_path", type=click.Path(), default=None, help="TOML recipe; the command line wins.")
@click.option("--model", default=None, help="Encoder size: tiny|small|base|large|huge|giant.")
@click.option("--patch-size", type=int, default=None, help="Patch size in pixels.")
@click.option("--image-size", default=None, help="Training crop size, S or HxW (default: the dataset's).")
@click.option("--pred-depth", type=int, default=None, help="Predictor depth.")
@click.option("--pred-width", type=int, default=None, help="Predictor width.")
@click.option("--loss", default=None, help="smooth_l1 (official code) | l2 (paper) | l1.")
@click.option("--dtype", default=None, help="Compute dtype: float32 | bfloat16 (parameters stay float32).")
@click.option("--scan-layers/--no-scan-layers", default=None,
              help="Run the blocks under lax.scan: compile time no longer grows with depth.")
@click.option("--remat", type=click.Choice(["none", "dots", "block"]), default=None,
              help="Activation checkpointing per block: keep matmul outputs (dots) or only block inputs (block).")
@click.option("--steps", type=int, default=None, help="Optimizer updates in the run (wins over --epochs).")
@click.option("--epochs", type=float, default=None, help="Epochs; one epoch is num_samples // batch_size updates.")
@click.option("--batch-size", type=int, default=None, help="Global examples per optimizer update.")
@click.option("--grad-accum", type=int, default=None, help="Split each batch into K micro-batches (one update).")
@click.option("--ipe-scale", type=float, default=None, help="Schedules run over steps x ipe_scale (official 1.0).")
@click.option("--mesh", default=None, help="Device mesh, e.g. data=-1,fsdp=1 (-1 takes the rest).")
@click.option("--seed", type=SEED, default=None, help="Seed of initialisation, data order and masks.")
@click.option("--save-every", type=int, default=None, help="Checkpoint every N updates (always at the end).")
@click.option("--keep", type=int, default=None, help="Keep the K most recent checkpoints (default 3).")
@click.option("--probe-every", type=int, default=None,
              help="Score the target encoder with a k-NN probe every N updates (and at step 0); needs --probe-data.")
@click.option("--probe-data", default=None,
              help="TRAIN.zarr,TEST.zarr: the labelled datasets of --probe-every (kept in memory: a few thousand samples).")
@click.option("--probe-k", type=int, default=None, help="Neighbours of the training-time k-NN probe (default 20).")
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
def command(ctx: click.Context, config_path, resume, force, coordinator, num_processes, process_id,
            as_json, verbose, quiet, **options) -> int:
    """Pretrain an encoder on a dataset (I-JEPA by default) with the official recipe.

    \b
    Examples:
      jepa train --config recipes/ijepa-digits-tiny.toml --data digits.zarr --out runs/digits
      jepa train --data in1k.zarr --out runs/vith14 --config recipes/ijepa-in1k-vith14.toml --mesh data=-1,fsdp=8
      jepa train --out runs/digits --data digits.zarr --resume
    """
    from jepa_cli.training import distributed

    distributed.initialize(coordinator, num_processes, process_id)

    from jepa_cli.training.config import resolve_config
    from jepa_cli.training.loop import Callbacks, train

    objective_keys = ("model", "patch_size", "pred_depth", "pred_width", "loss", "dtype", "scan_layers", "remat",
                      "npred", "min_keep",
                      "allow_overlap", "context_size", "official_positions", "official_truncation",
                      "collator_batch") + GENERATIVE_KEYS
    objective_config = {k: options.pop(k) for k in objective_keys}
    image_size = parse_hxw(options.pop("image_size"), "--image-size")
    if image_size is not None:
        objective_config["image_size"] = image_size[0] if image_size[0] == image_size[1] else list(image_size)
    for key in ("pred_scale", "aspect", "enc_scale"):
        objective_config[key] = _pair(options.pop(key), "--" + key.replace("_", "-"))
    values = {k: v for k, v in options.items() if v is not None}
    values["objective_config"] = {k: v for k, v in objective_config.items() if v is not None}
    config = resolve_config(values, config_path, resume=resume)

    import jax

    main = jax.process_index() == 0
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from jepa_cli.cli.common import stderr_console

    console = stderr_console(quiet or not main)
    progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[rate]}"),
                        TextColumn("{task.fields[knn]}"), TimeRemainingColumn(), console=console,
                        disable=quiet or not main or not console.is_terminal)  # a redirected stderr gets logs only
    task = {}

    def on_start(info):
        console.log(f"run {info['run']}: steps {info['start_step']} -> {info['steps']}, mesh {info['mesh']}, "
                    f"{info['devices']} devices, {info['processes']} process(es)")
        task["id"] = progress.add_task("train", total=info["steps"], completed=info["start_step"], loss="-", rate="",
                                      knn="")
        progress.start()  # only once validation passed: a refusal prints its one error line and nothing else
        task["t"] = None

    def on_step(m):
        import time

        now = time.perf_counter()
        rate = ""
        if task.get("t") is not None:
            rate = f"{config.batch_size / max(now - task['t'], 1e-9):,.0f} ex/s"
        task["t"] = now
        loss = m.get("loss")
        progress.update(task["id"], completed=m["step"], loss=f"{loss:.4f}" if loss is not None else "nan", rate=rate)
        if m.get("knn_top1") is not None:  # a training-time probe ran at this step
            progress.update(task["id"], knn=f"k-NN {m['knn_top1']:.3f}")
            console.log(f"step {m['step']}: k-NN top-1 {m['knn_top1']:.4f}, top-5 {m['knn_top5']:.4f} "
                        f"({m['probe_seconds']:.1f} s)")

    callbacks = Callbacks(on_start=on_start, on_step=on_step, on_log=lambda msg: console.log(msg),
                          on_checkpoint=(lambda s: console.log(f"checkpoint {s}")) if verbose else (lambda s: None))
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


class StoppedBySignal(JepaError):
    """Training stopped by SIGINT/SIGTERM after saving: the result is printed, then one error line
    (as any command stopped by a signal) and exit 130/143."""

    def __init__(self, signal_name: str, summary: dict) -> None:
        what = "terminated" if signal_name == "SIGTERM" else "interrupted"
        super().__init__(f"{what} ({signal_name}): saved step {summary.get('step')} in {summary.get('run')}; "
                         "continue with --resume")
        self.exit_code = SIGNAL_EXIT[signal_name]
