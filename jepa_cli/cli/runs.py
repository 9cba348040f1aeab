"""`jepa runs DIR...`."""

from __future__ import annotations

from typing import Any

import click

from jepa_cli.cli.common import emit, output_options


@click.command("runs")
@click.argument("folders", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=str))
@output_options
def command(folders: tuple[str, ...], as_json: bool, verbose: int, quiet: bool) -> None:
    """Compare runs in one table: objective, differing config keys, step, final loss, last probe.

    Each DIR is a run (a folder holding run.json) or a folder with runs below it. The config columns are
    the keys whose values differ between the runs (trainer keys, and the objective's options as
    OBJECTIVE.KEY); the probe columns are the last k-NN figures of `jepa train --probe-every`.

    \b
    Examples:
      jepa runs runs/
      jepa runs runs/baseline runs/wider --json
    """
    from jepa_cli.training.run_table import find_runs, run_table

    emit(run_table(find_runs(list(folders))), as_json, _print_table)


def _print_table(result: dict[str, Any]) -> None:
    """Plain aligned columns, never cut to the terminal's width (the keys that differ can be many)."""
    from jepa_cli.training.curves import run_labels

    rows = result["runs"]
    probed = any(row["probe"] for row in rows)
    header = ["run", "objective", *result["differing_keys"], "step", "status", "loss"]
    header += ["probe_step", "knn_top1", "knn_top5"] if probed else []
    right = {"step", "loss", "probe_step", "knn_top1", "knn_top5"}
    lines = [header]
    for label, row in zip(run_labels([row["run"] for row in rows]), rows):
        total = row["total_steps"]
        cells = [label, _text(row["objective"]), *(_text(row["config"][k]) for k in result["differing_keys"]),
                 f"{row['step']}/{total}" if total is not None else str(row["step"]), _text(row["status"]),
                 _text(row["final_loss"])]
        if probed:
            probe = row["probe"] or {}
            cells += [_text(probe.get("step")), _text(probe.get("knn_top1")), _text(probe.get("knn_top5"))]
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        click.echo("  ".join(cell.rjust(w) if name in right else cell.ljust(w)
                             for name, cell, w in zip(header, line, widths)).rstrip())


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ",".join(_text(v) for v in value)
    return str(value)
