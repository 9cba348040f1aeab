"""Training curves of one or more runs as a PNG (`jepa plot`), from each run's metrics.jsonl.

matplotlib is the optional `plot` extra; nothing else in the toolkit needs it.
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path
from typing import Any

from jepa_cli.errors import InputError

DEFAULT_METRICS = ("loss", "lr", "weight_decay", "ema_momentum", "repr_std", "repr_cov_offdiag", "sigreg_quality")
MAX_PANELS = 24  # one figure stays readable and its memory bounded (a panel is about 0.1 MPixel)
# positive and spanning decades
LOG_SCALE = {"loss", "lr", "repr_std", "repr_cov_offdiag", "target_std", "sigreg_quality"}


def run_labels(runs: list[str | Path]) -> list[str]:
    """Each run's legend label: the shortest suffix of its path that no other run's path ends with
    (`a/run` and `b/run` for two runs both named `run`, `run` alone when the name is unique). A run
    given twice gets the same label both times."""
    parts = [Path(os.path.abspath(run)).parts for run in runs]
    labels = []
    for i, own in enumerate(parts):
        others = [p for j, p in enumerate(parts) if j != i and p != own]
        k = next((k for k in range(1, len(own) + 1) if all(p[-k:] != own[-k:] for p in others)), len(own))
        labels.append(str(Path(*own[-k:])) if k < len(own) else str(runs[i]))
    return labels


def legend_text(label: str) -> str:
    """A label as matplotlib must be given it to draw it as written: every `$` escaped, so that no part
    of it is read as mathtext (`$\\frac{$` would be a parse error)."""
    return label.replace("$", r"\$")


def plot_runs(runs: list[str | Path], output: str | Path, metrics: tuple[str, ...] | None = None,
              force: bool = False, labels: list[str] | None = None) -> dict[str, Any]:
    """One panel per metric against the update step, every run overlaid, written atomically to
    `output` (a PNG). Runs are labelled `labels` (one per run, in order), else by run_labels.
    `metrics` None: those of DEFAULT_METRICS that some run logged (a flow run logs no representation
    statistics). A metric named that no run logged is an InputError naming it. Returns {"png", "runs",
    "labels", "metrics", "rows"} (rows: metrics.jsonl rows read per run)."""
    from jepa_cli.data import atomic
    from jepa_cli.training.runfiles import read_metrics, read_run

    chosen = metrics is not None
    metrics = tuple(dict.fromkeys(metrics if chosen else DEFAULT_METRICS))  # a metric named twice gets one panel
    if len(metrics) > MAX_PANELS:
        raise InputError(f"--metrics names {len(metrics)} metrics; at most {MAX_PANELS} panels fit one picture")
    if labels is not None and len(labels) != len(runs):
        raise InputError(f"--label given {len(labels)} time(s) for {len(runs)} run(s): one per run, in order")
    labels = list(labels) if labels is not None else run_labels(runs)
    atomic.check_output_file(output, force, atomic.PNG_MAGIC, "PNG picture", runs)  # a run holds only what jepa wrote
    series: dict[str, tuple[str, list[dict[str, Any]]]] = {}  # run -> (label, rows); a run given twice is drawn once
    for run, label in zip(runs, labels):
        read_run(run)  # a folder that is not a run is refused by name
        rows = read_metrics(run)
        if not rows:
            raise InputError(f"{run}: no metrics logged yet (metrics.jsonl is empty or missing)")
        series.setdefault(str(run), (label, rows))
    missing = [m for m in metrics if not any(m in row for _, rows in series.values() for row in rows)]
    if not chosen and len(missing) < len(metrics):
        metrics, missing = tuple(m for m in metrics if m not in missing), []
    if missing:
        raise InputError(f"no run logged {', '.join(missing)} (metrics.jsonl keys such as "
                         f"{', '.join(DEFAULT_METRICS)})")
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display, the same pixels on every machine
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("jepa plot needs matplotlib: pip install 'jepa-cli[plot]'") from None

    columns = min(3, len(metrics))
    rows_of_panels = math.ceil(len(metrics) / columns)
    figure, axes = plt.subplots(rows_of_panels, columns, figsize=(4.2 * columns, 3.0 * rows_of_panels),
                                squeeze=False, dpi=100)
    for panel, metric in zip(axes.flat, metrics):
        for label, rows in series.values():
            points = [(row["step"], row[metric]) for row in rows
                      if isinstance(row.get(metric), (int, float)) and math.isfinite(row[metric])]
            if points:
                steps, values = zip(*points)
                panel.plot(steps, values, label=legend_text(label), linewidth=1.2)
                if metric in LOG_SCALE and min(values) > 0:
                    panel.set_yscale("log")
        panel.set_title(metric, fontsize=10)
        panel.set_xlabel("step", fontsize=8)
        panel.tick_params(which="both", labelsize=7)
        panel.grid(alpha=0.3)
    for panel in list(axes.flat)[len(metrics):]:
        panel.axis("off")
    lines = axes.flat[0].get_lines()  # given explicitly: matplotlib leaves out labels that start with `_`
    axes.flat[0].legend(lines, [line.get_label() for line in lines], fontsize=7)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})  # no version stamp: same bytes on rerun
    plt.close(figure)
    atomic.write_file(output, buffer.getvalue(), force, atomic.PNG_MAGIC, "PNG picture")
    return {"png": str(output), "runs": [str(r) for r in runs], "labels": labels, "metrics": list(metrics),
            "rows": {run: len(rows) for run, (_, rows) in series.items()}}
