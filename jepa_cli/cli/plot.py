"""`jepa plot`."""

from __future__ import annotations

import click

from jepa_cli.cli.common import emit, output_options
from jepa_cli.cli.complete import complete_runs


@click.command("plot")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=str), shell_complete=complete_runs)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=str),
              help="The PNG to write.")
@click.option("--metrics", default=None,
              help="Comma-separated metrics.jsonl keys, one panel each "
                   "[default: those of loss,lr,weight_decay,ema_momentum,repr_std,repr_cov_offdiag the runs logged].")
@click.option("--label", "labels", multiple=True, metavar="NAME",
              help="A run's legend label; repeat it, one per run, in order [default: the shortest distinct end "
                   "of each run's path].")
@click.option("--force", is_flag=True, help="Replace an existing PNG (nothing else).")
@output_options
def command(runs: tuple[str, ...], output: str, metrics: str | None, labels: tuple[str, ...], force: bool,
            as_json: bool, verbose: int, quiet: bool) -> None:
    """Plot training curves of one or more runs against the step, overlaid (needs the plot extra).

    \b
    Examples:
      jepa plot runs/digits -o curves.png
      jepa plot runs/a runs/b -o compare.png --metrics loss,effective_rank,knn_top1
      jepa plot a/run b/run -o compare.png --label baseline --label wider
    """
    from jepa_cli.training.curves import plot_runs

    chosen = tuple(m.strip() for m in metrics.split(",") if m.strip()) if metrics is not None else None
    if chosen == ():
        from jepa_cli.errors import InputError

        raise InputError("--metrics names no metric")
    result = plot_runs(list(runs), output, chosen, force=force, labels=list(labels) if labels else None)
    emit(result, as_json,
         lambda r: click.echo(f"wrote {r['png']}: {', '.join(r['metrics'])} of {len(r['runs'])} run(s)"))
