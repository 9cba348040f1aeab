"""`jepa ema-inspect RUN`."""

from __future__ import annotations

from typing import Any

import click

from jepa_cli.cli.common import SPARK_BLOCKS, emit, output_options, spark_levels, stdout_console, warn
from jepa_cli.cli.complete import complete_runs, complete_steps

# Without colour the schedule gets a rule under it: these under the steps trained, those under the rest.
PAST_RULE, FUTURE_RULE = "━", "╌"


@click.command("ema-inspect")
@click.argument("run", type=click.Path(), shell_complete=complete_runs)
@click.option("--at", "at", type=int, default=None, help="Also evaluate the momentum schedule at this step.")
@click.option("--step", "step", type=int, default=None, shell_complete=complete_steps,
              help="Inspect this checkpoint (default: the latest).")
@output_options
def command(run: str, at: int | None, step: int | None, as_json: bool, verbose: int, quiet: bool) -> None:
    """Show the EMA momentum schedule of a run and how far the EMA is from the online weights.

    \b
    For each top-level module of the averaged subtree: ||online - ema|| / ||ema|| and the cosine.
    Example:
      jepa ema-inspect runs/digits --at 100
    """
    from jepa_cli.training.ema import KEPT_WARNING, ema_report

    report = ema_report(run, at=at, step=step, on_fallback=lambda _step, message: warn(message, quiet))
    if report["init_weight"] > KEPT_WARNING and report["source"] is not None:
        warn(f"the target encoder of {run} still holds {report['init_weight']:.2f} of its random initialisation at "
             f"step {report['step']}: it probes much like an untrained encoder (a faster EMA, --ema START,END, or "
             "more updates)", quiet)
    if as_json:
        emit({k: v for k, v in report.items()}, True)
    else:
        _human(report)


def _human(r: dict[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    console = stdout_console()
    console.print(Text.assemble((str(r["run"]), "bold"), f": step {r['step']} of {r['total_steps']}, EMA momentum now ",
                                (f"{r['momentum']:.6f}", "bold cyan"), f" (source: {r['source']})"))
    console.print(f"the EMA still holds {r['init_weight']:.3f} of its initial value (the product of the momenta so far)")
    if "at" in r:
        console.print(Text.assemble(f"momentum at step {r['at']['step']}: ",
                                    (f"{r['at']['momentum']:.6f}", "bold cyan")))
    values = [p["momentum"] for p in r["schedule"]]
    lo, hi = min(values), max(values)
    past = [p["step"] <= r["step"] for p in r["schedule"]]
    text = Text()
    for is_past, level in zip(past, spark_levels(values)):
        text.append(SPARK_BLOCKS[level], style="bold green" if is_past else "dim")
    colour = console.color_system is not None and not console.no_color
    console.print(Text(f"{hi:.4f} ┐ ", style="dim") + Text(""))
    console.print(Text("       │ ") + text)
    if not colour:  # past and future differ only in style: a rule under the curve tells them apart
        console.print("       │ " + "".join(PAST_RULE if is_past else FUTURE_RULE for is_past in past))
    console.print(Text(f"{lo:.4f} ┘ 0{' ' * max(1, len(values) - len(str(r['total_steps'])) - 1)}{r['total_steps']}",
                       style="dim"))
    if colour:
        console.print(Text("past", style="bold green") + Text(" / ") + Text("future", style="dim"))
    else:
        console.print(f"{PAST_RULE * 2} past / {FUTURE_RULE * 2} future")
    table = Table(title="EMA vs online")
    table.add_column("module")
    table.add_column("params", justify="right")
    table.add_column("||online-ema||/||ema||", justify="right")
    table.add_column("cosine", justify="right")
    for m in r["modules"]:
        table.add_row(str(m["name"]), f"{m['params']:,}", f"{m['relative_distance']:.3e}", f"{m['cosine']:.6f}")
    console.print(table)
