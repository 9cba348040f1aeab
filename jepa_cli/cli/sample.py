"""`jepa sample RUN -n N -o samples.zarr`: draw samples from a flow or diffusion run."""

from __future__ import annotations

import click

from jepa_cli.cli.common import SEED, emit, output_options, progress_bar, warn
from jepa_cli.cli.complete import complete_runs, complete_steps
from jepa_cli.cli.declared import text_type
from jepa_cli.objectives.genconfig import ETA_RANGE, MAX_GUIDANCE_SCALE, MAX_SAMPLING_STEPS


def _classes(ctx, param, value):
    if value is None:
        return None
    if value != "all":
        raise click.BadParameter(f"the only value is 'all', got {value!r}", param_hint="--classes")
    return value


@click.command("sample")
@click.argument("run", type=click.Path(path_type=str), shell_complete=complete_runs)
@click.option("-n", "num", type=click.IntRange(min=1), default=64, show_default=True,
              help="Samples per class with --class/--classes, else in all.")
@click.option("-o", "--output", required=True, type=click.Path(path_type=str), help="The dataset to write.")
@click.option("--class", "classes", type=int, multiple=True, help="Class id to sample (repeatable).")
@click.option("--classes", "all_classes", callback=_classes, default=None, help="'all': n samples of every class.")
@click.option("--guidance-scale", type=click.FloatRange(0.0, MAX_GUIDANCE_SCALE), default=1.0, show_default=True,
              help="Classifier-free guidance scale w (1: none).")
@click.option("--guidance-interval", type=text_type("range"), default=None,
              help="LO,HI: guide only where the noise level (t for flow, sigma for diffusion) is in (LO, HI] "
                   "(default: the whole trajectory).")
@click.option("--sampler", type=click.Choice(["euler", "heun", "ddim"]), default="euler", show_default=True,
              help="ODE sampler (euler/heun) or DDIM.")
@click.option("--eta", type=click.FloatRange(*ETA_RANGE), default=0.0, show_default=True,
              help="DDIM stochasticity (0: deterministic, 1: DDPM's noise).")
@click.option("--steps", type=click.IntRange(1, MAX_SAMPLING_STEPS), default=32, show_default=True, help="Sampling steps.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="PRNG seed.")
@click.option("--step", type=click.IntRange(min=0), default=None, shell_complete=complete_steps,
              help="Checkpoint step (default: the latest).")
@click.option("--weights", type=click.Choice(["ema", "online"]), default="ema", show_default=True,
              help="The EMA or the online parameters.")
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True,
              help="Samples per jitted trajectory.")
@click.option("--mesh", default="data=-1,fsdp=1", show_default=True, help="Device mesh, as in `jepa train`.")
@click.option("--png", "png_path", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG grid of the samples: one row per class, labelled, its first ten samples.")
@click.option("--show", is_flag=True, help="Preview the first four samples of each class (ten classes at most) in the "
                                            "terminal.")
@click.option("--force", is_flag=True, help="Overwrite an existing output.")
@output_options
def command(run, num, output, classes, all_classes, guidance_scale, guidance_interval, sampler, eta, steps, seed,
            step, weights, batch_size, mesh, png_path, show, force, as_json, verbose, quiet):
    """Draw samples from a flow or diffusion run into a dataset.

    \b
    Examples:
      jepa sample runs/flow -n 100 --classes all -o samples.zarr --guidance-scale 2 --guidance-interval 0.3,0.8
      jepa sample runs/flow -n 8 --class 3 -o threes.zarr --png threes.png --sampler heun --steps 16
    """
    import time

    from jepa_cli.sampling.run import sample_run

    start = time.perf_counter()
    with progress_bar("sampling", None, "samples", quiet=quiet or as_json) as advance:
        def on_start(total, drawn):
            advance.set_total(total - drawn)  # the bar counts what this run draws
            if drawn:
                advance.log(f"resuming: {drawn} of {total} samples already drawn")

        summary = sample_run(run, output, n=num, classes=list(classes) or None, all_classes=all_classes == "all",
                             guidance_scale=guidance_scale, guidance_interval=guidance_interval, sampler=sampler,
                             steps=steps, eta=eta, seed=seed, step=step, weights=weights, batch_size=batch_size,
                             mesh=mesh, force=force, png=png_path, on_progress=advance, on_start=on_start,
                             on_log=lambda message: warn(message, quiet))
    seconds = time.perf_counter() - start
    summary["seconds"] = round(seconds, 3)
    if show and summary["modality"] == "image":
        from rich.console import Console

        from jepa_cli.sampling.run import preview

        Console(stderr=as_json, soft_wrap=True).print(preview(output), markup=False, highlight=False)
    emit(summary, as_json)
