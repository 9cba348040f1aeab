"""`jepa runs DIR...`."""

from __future__ import annotations

from typing import Any

import click

from jepa_cli.cli.common import emit, output_options, warn


@click.command("runs")
@click.argument("folders", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=str))
@click.option("--objective", default=None, metavar="NAME", help="Only the runs of this objective.")
@click.option("--columns", default=None, metavar="A,B,...",
              help="The table's columns after the run: objective, step, status, loss, sigreg_quality, probe_step, "
                   "probe figures "
                   "(knn_top1, linear_top1, ...) or config keys (lr, ijepa.model.depth); default: the config keys "
                   "that differ and all of those.")
@click.option("--probes", "probe_folders", multiple=True, type=click.Path(exists=True, file_okay=False, path_type=str),
              help="A folder whose .json files, at any depth, may hold `jepa probe --json` results of the runs "
                   "(besides the run's folder and the folder holding it). Repeatable.")
@output_options
def command(folders: tuple[str, ...], objective: str | None, columns: str | None, probe_folders: tuple[str, ...],
            as_json: bool, verbose: int, quiet: bool) -> None:
    """Compare runs: one table per objective of the config keys that differ, step, final loss, last probe.

    Each DIR is a run (a folder holding run.json) or a folder with runs below it. The config columns are
    the keys whose values differ between the runs of one objective (trainer keys, and the objective's
    options as OBJECTIVE.KEY). The probe columns are the figures of the newest step probed, by `jepa train
    --probe-every` (knn) or by a `jepa probe ... --json > FILE.json` result of the run's target encoder
    found in a .json file in the run's folder, in the folder holding it (where the recipes write them) or
    below a --probes folder. sigreg_quality is the last label-free figure the trainer logged (lower is
    better spread; docs/small-data.md), shown when a run logged one.

    \b
    Examples:
      jepa runs runs/
      jepa runs runs/ --objective ijepa --columns lr,loss,linear_top1
      jepa runs runs/baseline runs/wider --probes probes/ --json
    """
    from pathlib import Path

    from jepa_cli.evaluation.run_table import find_runs, run_table

    runs = find_runs(list(folders), warn=lambda message: warn(message, quiet))
    names = None if columns is None else [name.strip() for name in columns.split(",") if name.strip()]
    emit(run_table(runs, objective=objective, columns=names, probe_folders=[Path(f) for f in probe_folders]),
         as_json, _print_tables)


def _print_tables(result: dict[str, Any]) -> None:
    """One table per objective, in the order of their first run, each under its name when there are
    several."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in result["runs"]:
        groups.setdefault(str(row["objective"]), []).append(row)
    for i, (objective, rows) in enumerate(groups.items()):
        if len(groups) > 1:
            click.echo(("\n" if i else "") + f"{objective}: {len(rows)} run(s)")
        _print_table(rows, result["columns"], result["objectives"][objective])


def _print_table(rows: list[dict[str, Any]], columns: list[str] | None, differing: list[str]) -> None:
    """Plain aligned columns, never cut to the terminal's width (the keys that differ can be many)."""
    from jepa_cli.evaluation.probe_files import PROBE_KINDS, figure_keys
    from jepa_cli.training.curves import run_labels

    figures = [key for kind in PROBE_KINDS for key in figure_keys(kind) if any(key in (row["probe"] or {}) for row in rows)]
    if columns is None:
        columns = ["objective", *differing, "step", "status", "loss"]
        columns += ["sigreg_quality"] if any(row["sigreg_quality"] is not None for row in rows) else []
        columns += ["probe_step", *figures] if any(row["probe"] for row in rows) else []
    header = ["run", *(c for c in columns if c != "run")]
    right = {"step", "loss", "sigreg_quality", "probe_step",
             *(key for kind in PROBE_KINDS for key in figure_keys(kind))}
    lines = [header]
    for label, row in zip(run_labels([row["run"] for row in rows]), rows):
        lines.append([label, *(_cell(row, name) for name in header[1:])])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        click.echo("  ".join(cell.rjust(w) if name in right else cell.ljust(w)
                             for name, cell, w in zip(header, line, widths)).rstrip())


def _cell(row: dict[str, Any], name: str) -> str:
    """The text of column `name` (runs.py's COLUMNS, a probe figure, a config key) in `row`."""
    if name == "step":
        total = row["total_steps"]
        return f"{row['step']}/{total}" if total is not None else str(row["step"])
    if name == "loss":
        return _text(row["final_loss"])
    if name == "sigreg_quality":
        return _text(row["sigreg_quality"])
    if name == "probe_step":
        return _text((row["probe"] or {}).get("step"))
    if name in ("objective", "status"):
        return _text(row[name])
    if name in row["config"]:
        return _text(row["config"][name])
    return _text((row["probe"] or {}).get(name))


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ",".join(_text(v) for v in value)
    return str(value)
