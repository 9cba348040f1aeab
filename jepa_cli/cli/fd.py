"""`jepa fd A.zarr B.zarr`: Frechet distance between two datasets' feature distributions."""

from __future__ import annotations

import click

from jepa_cli.cli.common import emit, output_options, progress_bar, warn
from jepa_cli.cli.complete import complete_datasets, complete_runs


@click.command("fd")
@click.argument("a", type=click.Path(path_type=str), shell_complete=complete_datasets)
@click.argument("b", type=click.Path(path_type=str), shell_complete=complete_datasets)
@click.option("--run", type=click.Path(path_type=str), default=None,
              shell_complete=complete_runs,
              help="Encode image datasets with this JEPA run's target encoder first (FD in its representation space).")
@click.option("--batch-size", type=click.IntRange(min=1), default=128, show_default=True, help="Images per encoder step.")
@output_options
def command(a, b, run, batch_size, as_json, verbose, quiet):
    """Frechet distance between the feature distributions of two datasets.

    Latent datasets are compared as they are ([N, T, D] averaged over T); image datasets as flattened
    pixels in [0, 1], or with --run as mean-pooled tokens of the run's target encoder (video and audio
    datasets only so, with a V-JEPA or Audio-JEPA run). Means and covariances in float64; what does
    not fit in memory is refused before it is read.

    \b
    Examples:
      jepa fd emb-real.zarr emb-samples.zarr --json
      jepa fd digits-test.zarr samples.zarr --run runs/ijepa
    """
    from jepa_cli.evaluation.fd import fd_datasets

    with progress_bar("features", None, "samples", quiet=quiet or as_json) as advance:
        result = fd_datasets(a, b, run, batch_size, on_log=lambda m: warn(m, quiet), on_start=advance.set_total,
                             on_progress=advance)
    emit(result, as_json)
