"""`jepa encode-latents RUN DATA.zarr -o EMB.zarr`: a dataset through a trained encoder, to disk."""

from __future__ import annotations

import click

from jepa_cli.cli.common import emit, output_options, progress_bar, warn
from jepa_cli.cli.complete import complete_datasets, complete_runs, complete_steps
from jepa_cli.errors import InputError


# the progress bar's unit for one example of each dataset modality
EXAMPLE_UNITS = {"image": "images", "video": "clips", "audio": "clips", "latent": "vectors"}


@click.command("encode-latents")
@click.argument("run", type=click.Path(path_type=str), shell_complete=complete_runs)
@click.argument("data", type=click.Path(path_type=str), shell_complete=complete_datasets)
@click.option("-o", "--output", required=True, type=click.Path(path_type=str), help="The latent dataset to write.")
@click.option("--step", type=click.IntRange(min=0), default=None, shell_complete=complete_steps,
              help="Checkpoint step (default: the latest).")
@click.option("--weights", type=click.Choice(["target", "context"]), default="target", show_default=True,
              help="The EMA target encoder (as I-JEPA evaluates) or the context encoder.")
@click.option("--pool", type=click.Choice(["mean", "none"]), default="mean", show_default=True,
              help="mean: [N, D] vectors; none: patch tokens [N, T, D] (for the attentive probe).")
@click.option("--layers", type=click.Choice(["last", "last4"]), default="last", show_default=True,
              help="last4: concatenate the last four blocks' outputs (the I-JEPA probe protocol).")
@click.option("--batch-size", type=click.IntRange(min=1), default=128, show_default=True,
              help="Images per step (rounded up to a multiple of the data-parallel devices).")
@click.option("--mesh", default="data=-1,fsdp=1", show_default=True, help="Device mesh, as in `jepa train`.")
@click.option("--force", is_flag=True, help="Overwrite an existing output.")
@output_options
def command(run, data, output, step, weights, pool, layers, batch_size, mesh, force, as_json, verbose, quiet):
    """Encode a dataset with a trained encoder into a latent dataset.

    Runs the evaluation transform (resize + centre crop to the training size) and the encoder of
    RUN's latest (or --step) checkpoint over DATA, and writes a dataset of modality "latent" with
    the labels copied, provenance, and latent_shift / latent_scale (per-channel mean and 1/std;
    normalise as (z - latent_shift) * latent_scale). An interrupted run resumes where it stopped
    when rerun with the same arguments.

    \b
    Examples:
      jepa encode-latents runs/ijepa digits-train.zarr -o emb-train.zarr
      jepa encode-latents runs/ijepa digits-test.zarr -o tok-test.zarr --pool none --layers last4
    """
    import time
    from pathlib import Path

    from jepa_cli.evaluation.run_encoder import encode_run

    total, unit = None, "examples"
    if (Path(data) / "inputs" / "zarr.json").exists() and (Path(data) / "zarr.json").exists():
        from jepa_cli.data import store
        from jepa_cli.data.describe import array_summary

        total = array_summary(Path(data) / "inputs")["shape"][0]
        try:
            unit = EXAMPLE_UNITS.get(store.read_attributes(data).get("modality", "image"), unit)
        except InputError:
            pass  # encode_run says what is wrong with the dataset
    state = {}
    start = time.perf_counter()
    with progress_bar("encoding", total, unit, quiet=quiet or as_json) as advance:
        def on_start(n, done):
            state["resumed"] = done
            if done:
                advance.log(f"resuming: {done} of {n} samples already encoded")

        summary = encode_run(run, data, output, step=step, weights=weights, pool=pool, layers=layers,
                             batch_size=batch_size, mesh=mesh, force=force, on_progress=advance, on_start=on_start,
                             on_log=lambda message: warn(message, quiet))
    seconds = time.perf_counter() - start
    encoded = summary["num_samples"] - state.get("resumed", 0)
    summary["seconds"] = round(seconds, 3)
    summary["images_per_second"] = round(encoded / seconds, 1) if seconds > 0 else None
    emit(summary, as_json)
