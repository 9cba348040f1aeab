"""`jepa fd A.zarr B.zarr`: Frechet distance, precision, recall, density and coverage of two datasets' features."""

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
@click.option("--k", "k", type=click.IntRange(min=1), default=None,
              help="Neighbours that set each sample's ball for precision and recall (default 3, Kynkaanniemi "
                   "et al. 2019; null for a set of 3 samples or fewer).")
@click.option("--dc-k", "dc_k", type=click.IntRange(min=1), default=None,
              help="Neighbours that set each reference sample's ball for density and coverage (default 5, "
                   "Naeem et al. 2020; null for a set of 5 samples or fewer).")
@click.option("--standardise", is_flag=True,
              help="Shift and scale every feature by A's mean and std before every figure.")
@output_options
def command(a, b, run, batch_size, k, dc_k, standardise, as_json, verbose, quiet):
    """Frechet distance, precision, recall, density and coverage between two datasets' features.

    A is the reference (real samples), B the set compared with it (generated samples). Precision is
    the share of B's samples inside A's k-nearest-neighbour manifold, recall the share of A's inside
    B's; density counts the balls of A around each of B's samples (over k, about 1 for a set like A),
    coverage is the share of A's balls holding one of B's samples. Spread-out, blurred samples have
    wide balls and so a high recall; coverage uses A's balls only and does not reward them. Latent
    datasets are compared as they are ([N, T, D] averaged over T); image datasets as flattened pixels
    in [0, 1], or with --run as mean-pooled tokens of the run's target encoder
    (video and audio datasets only so, with a V-JEPA or Audio-JEPA run). Float64 throughout; what
    does not fit in memory is refused before it is read.

    \b
    Examples:
      jepa fd emb-real.zarr emb-samples.zarr --json
      jepa fd digits-test.zarr samples.zarr --run runs/ijepa --k 5 --dc-k 5
    """
    from jepa_cli.evaluation.fd import fd_datasets

    with progress_bar("features", None, "samples", quiet=quiet or as_json) as advance:
        result = fd_datasets(a, b, run, batch_size, on_log=lambda m: warn(m, quiet), on_start=advance.set_total,
                             on_progress=advance, k=k, standardise_features=standardise, dc_k=dc_k)
    emit(result, as_json)
