"""One row per training run for `jepa runs`: its objective, the configuration keys that differ between
the runs, how far it got, its final loss and its last training-time probe (docs/formats.md, "Runs and
checkpoints").

Everything comes from each run's run.json and metrics.jsonl; no checkpoint is opened.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from jepa_cli.errors import InputError
from jepa_cli.training.run import RUN_FILE, checkpoint_steps, read_metrics, read_run

PROBE_KEYS = ("knn_top1", "knn_top5")  # the training-time probe's figures (--probe-every)
SKIPPED_KEYS = ("out",)  # differs between every two runs and says nothing the run's name does not


def find_runs(folders: list[str | Path]) -> list[Path]:
    """The runs named by `folders`: a folder holding run.json is a run; any other folder stands for
    the runs below it, found at any depth (not inside a run, nor in folders starting with "."), in
    sorted path order. A run named twice is listed once. InputError naming a folder that does not
    exist or holds no run."""
    found: list[Path] = []
    for folder in map(Path, folders):
        if not folder.is_dir():
            raise InputError(f"{folder}: no such folder")
        if (folder / RUN_FILE).is_file():
            below = [folder]
        else:
            below = []
            for parent, dirs, files in os.walk(folder, followlinks=False):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                if RUN_FILE in files and Path(parent) != folder:
                    below.append(Path(parent))
                    dirs[:] = []  # a run's checkpoints hold no other run
            if not below:
                raise InputError(f"{folder}: holds no training run (no {RUN_FILE} in it or below it)")
        found += [run for run in sorted(below) if run not in found]
    return found


def flat_config(record: dict[str, Any]) -> dict[str, Any]:
    """A run's configuration as one level of keys: the trainer keys, and the objective's own options
    as `OBJECTIVE.KEY` (the table they sit in of a TOML recipe), nested tables joined with dots."""
    config = dict(record.get("config") or {})
    objective_config = config.pop("objective_config", None) or {}
    out = {k: v for k, v in config.items() if k not in SKIPPED_KEYS}
    out.update(_flatten(objective_config, str(config.get("objective") or "objective")))
    return out


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(_flatten(inner, f"{prefix}.{key}"))
        return out
    return {prefix: value}


def run_table(runs: list[Path]) -> dict[str, Any]:
    """{"differing_keys": [...], "runs": [row, ...]}: each row the run's path, objective, status, step
    (the last logged update, else its newest checkpoint) of total_steps, final_loss (the last finite
    loss logged, None when none was), probe (the last row with k-NN figures: its step and those
    figures; None when the run never probed) and config (its values of the differing keys)."""
    records = [read_run(run) for run in runs]
    configs = [flat_config(record) for record in records]
    keys = sorted({key for config in configs for key in config})
    missing = object()
    differing = [key for key in keys if len({_key(config.get(key, missing)) for config in configs}) > 1]
    rows = []
    for run, record, config in zip(runs, records, configs):
        metrics = read_metrics(run)
        steps = checkpoint_steps(run)
        losses = [row["loss"] for row in metrics if _finite(row.get("loss"))]
        probed = [row for row in metrics if any(_finite(row.get(k)) for k in PROBE_KEYS)]
        rows.append({
            "run": str(run),
            "objective": config.get("objective"),
            "status": record.get("status"),
            "step": metrics[-1]["step"] if metrics else (steps[-1] if steps else 0),
            "total_steps": (record.get("lengths") or {}).get("steps"),
            "final_loss": float(losses[-1]) if losses else None,
            "probe": ({"step": probed[-1]["step"], **{k: probed[-1].get(k) for k in PROBE_KEYS}}
                      if probed else None),
            "config": {key: config.get(key) for key in differing},
        })
    return {"differing_keys": differing, "runs": rows}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _key(value: Any) -> str:
    """A hashable stand-in for a config value (lists and dicts compare by their contents)."""
    return repr(value)
