"""One row per training run for `jepa runs`: its objective, the configuration keys that differ between
the runs, how far it got, its final loss and its last training-time probe (docs/formats.md, "Runs and
checkpoints").

Everything comes from each run's run.json and metrics.jsonl; no checkpoint is opened.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable

from jepa_cli.errors import InputError
from jepa_cli.training.runfiles import RUN_FILE, check_local_run, checkpoint_steps, read_metrics, read_run

PROBE_KEYS = ("knn_top1", "knn_top5")  # the training-time probe's figures (--probe-every)
QUALITY_KEY = "sigreg_quality"  # the label-free figure the trainer logs (evaluation/quality.py)
SKIPPED_KEYS = ("out",)  # differs between every two runs and says nothing the run's name does not


def find_runs(folders: list[str | Path], warn: Callable[[str], None] = lambda message: None) -> list[Path]:
    """The runs named by `folders`: a folder holding run.json is a run; any other folder stands for
    the runs below it, found at any depth (not inside a run, nor in folders starting with "."), in
    sorted path order. Symbolic links to folders are followed, each folder entered once (a link back
    up is no loop); a folder that cannot be read is named by `warn`. A run named twice is listed once.
    InputError naming a folder that does not exist or holds no run."""
    found: list[Path] = []
    for folder in folders:
        check_local_run(folder)
    for folder in map(Path, folders):
        if not folder.is_dir():
            raise InputError(f"{folder}: no such folder")
        if os.path.lexists(folder / RUN_FILE):
            below = [folder]
        else:
            below = []
            entered: set[tuple[int, int]] = set()
            for parent, dirs, files in os.walk(folder, followlinks=True, onerror=lambda exc: warn(
                    f"{exc.filename}: cannot read this folder ({(exc.strerror or 'unreadable').lower()}); the runs in it are not listed")):
                try:
                    info = os.stat(parent)
                except OSError:
                    info = None
                if info is None or (info.st_dev, info.st_ino) in entered:
                    dirs[:] = []
                    continue
                entered.add((info.st_dev, info.st_ino))
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


COLUMNS = ("objective", "step", "status", "loss", QUALITY_KEY, "probe_step")  # the table's columns besides config keys


def run_table(runs: list[Path], objective: str | None = None, columns: list[str] | None = None,
              probe_folders: list[Path] = ()) -> dict[str, Any]:
    """{"differing_keys": [...], "objectives": {OBJECTIVE: [its differing keys]}, "columns": columns,
    "runs": [row, ...]}: each row the run's path, objective, status, step (the last logged update, else
    its newest checkpoint) of total_steps, final_loss (the last finite loss logged, None when none was),
    sigreg_quality (the last finite one logged, None when none was), probe (last_probe; None when the
    run was never probed) and config (its values of `columns`' config keys, else of the keys that
    differ between the runs of its objective: runs of other objectives do not count, their options
    are other options).

    `objective` keeps the runs of that objective only; `columns` names the table's columns (COLUMNS,
    probe figures such as `linear_top1`, configuration keys); InputError for an objective no run has
    or a column no run has. The probe results of files are read from the `.json` files in each run's
    folder and in the folder holding it, and at any depth below `probe_folders` (evaluation/probe_files.py)."""
    from jepa_cli.evaluation.probe_files import PROBE_KINDS, figure_keys, probe_results

    records = [read_run(run) for run in runs]
    configs = [flat_config(record) for record in records]
    if objective is not None:
        kept = [i for i, config in enumerate(configs) if config.get("objective") == objective]
        if not kept:
            names = sorted({str(config.get("objective")) for config in configs})
            raise InputError(f"--objective {objective}: none of the {len(runs)} run(s) has it "
                             f"(their objectives: {', '.join(names)})")
        runs, records, configs = ([items[i] for i in kept] for items in (runs, records, configs))
    by_objective: dict[str, list[dict[str, Any]]] = {}
    for config in configs:
        by_objective.setdefault(str(config.get("objective")), []).append(config)
    objectives = {name: _differing(group) for name, group in by_objective.items()}
    if columns is not None:
        known = {key for config in configs for key in config}
        figures = {key for kind in PROBE_KINDS for key in figure_keys(kind)}
        unknown = [c for c in columns if c not in known and c not in figures and c not in COLUMNS and c != "run"]
        if unknown:
            raise InputError(f"--columns {','.join(unknown)}: no such column (the columns are {', '.join(COLUMNS)}, "
                             f"probe figures such as knn_top1, and the keys of `jepa runs --json`'s config, e.g. "
                             f"{', '.join(sorted(known)[:3])})")
    files = probe_results({folder for run in runs for folder in (run, run.parent)}, probe_folders)
    rows = []
    for run, record, config in zip(runs, records, configs):
        metrics = read_metrics(run)
        steps = checkpoint_steps(run)
        losses = [row["loss"] for row in metrics if _finite(row.get("loss"))]
        qualities = [row[QUALITY_KEY] for row in metrics if _finite(row.get(QUALITY_KEY))]
        keys = [c for c in columns if c in known] if columns is not None else objectives[str(config.get("objective"))]
        rows.append({
            "run": str(run),
            "objective": config.get("objective"),
            "status": record.get("status"),
            "step": metrics[-1]["step"] if metrics else (steps[-1] if steps else 0),
            "total_steps": (record.get("lengths") or {}).get("steps"),
            "final_loss": float(losses[-1]) if losses else None,
            QUALITY_KEY: float(qualities[-1]) if qualities else None,
            "probe": last_probe(metrics, [row for row in files if row["run"] == str(run.resolve())]),
            "config": {key: config.get(key) for key in keys},
        })
    differing = sorted({key for keys in objectives.values() for key in keys})
    return {"differing_keys": differing, "objectives": objectives, "columns": columns, "runs": rows}


def last_probe(metrics: list[dict[str, Any]], files: list[dict[str, Any]]) -> dict[str, Any] | None:
    """{"step": S, FIGURE: value, ...} at S, the newest step probed: by the training-time probe (the
    metrics rows with k-NN figures: `knn_top1`, `knn_top5`) or by a probe result of a file
    (probe_files.read_probe_file: `KIND_top1`, `KIND_top5`). A file's figures replace the training-time
    probe's of its kind at the same step, and of two files of one kind at that step the one written
    last counts. None when the run was never probed."""
    from jepa_cli.evaluation.probe_files import figure_keys

    probed = [row for row in metrics if any(_finite(row.get(k)) for k in PROBE_KEYS)]
    steps = [probed[-1]["step"]] if probed else []
    steps += [row["step"] for row in files]
    if not steps:
        return None
    step = max(steps)
    out: dict[str, Any] = {"step": step}
    if probed and probed[-1]["step"] == step:
        out.update({k: probed[-1].get(k) for k in PROBE_KEYS})
    for row in sorted((row for row in files if row["step"] == step), key=lambda row: _mtime(row["file"])):
        top1, top5 = figure_keys(row["probe"])
        out.update({top1: row["top1"], top5: row["top5"]})
    return out


def _differing(configs: list[dict[str, Any]]) -> list[str]:
    """The keys whose values are not the same in every config (a key a config lacks counting as a value)."""
    keys = sorted({key for config in configs for key in config})
    missing = object()
    return [key for key in keys if len({_key(config.get(key, missing)) for config in configs}) > 1]


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _key(value: Any) -> str:
    """A hashable stand-in for a config value (lists and dicts compare by their contents)."""
    return repr(value)
