"""Resumable outputs: long writes (`encode-latents`, `sample`) that a rerun continues.

The output is built in a hidden sibling `.NAME.partial/` (no random suffix: a rerun finds it),
locked by its writer for as long as it works (`locks.resumable_partial`). It holds `job.json`, what
is being computed and the row layout, and `progress/UNIT.npz`, one file per finished unit of rows
(with whatever the writer keeps of that unit, e.g. its statistics). A rerun of the same job skips
the finished units; another job, or a damaged `job.json`, empties the partial first (each said
through `log`); a damaged unit file is removed and its unit done again. `finish` removes the
bookkeeping before the directory is moved into place (docs/formats.md, "Resumable writes").
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jepa_cli.data import buckets
from jepa_cli.data.files import read_json, replace_file
from jepa_cli.data.jsonvalues import json_value
from jepa_cli.data.urls import BucketPath, location

PARTIAL_SUFFIX = ".partial"
JOB_FILE = "job.json"
PROGRESS_DIR = "progress"


def partial_path(output: str | os.PathLike | BucketPath) -> Path:
    """`.NAME.partial` beside the output `NAME`; for an output in a bucket, in its local staging
    folder (`buckets.staging_folder`), from which the finished output is published."""
    output = location(output)
    if isinstance(output, BucketPath):
        return buckets.staging_folder(output) / f".{output.name}{PARTIAL_SUFFIX}"
    return output.with_name(f".{output.name}{PARTIAL_SUFFIX}")


def open_partial(tmp: Path, job: dict[str, Any], layout: dict[str, Any], log: Callable[[str], None],
                 changed: Callable[[dict[str, Any]], str | None] = lambda known: None) -> dict[str, Any]:
    """The record {"job": job, **layout} of the partial output `tmp` (locked by this process): the
    recorded one when it holds the same job (its layout wins: a resume keeps the units it started
    with), else a fresh one, after emptying `tmp`. `changed(known_job)` may say why a recorded job
    differs (e.g. "SOURCE changed since it was started"); the default reason is "another job"."""
    job = json_value(job)  # as it reads back from job.json
    job_path = tmp / JOB_FILE
    if job_path.exists():
        try:
            recorded = read_json(job_path)
        except ValueError:
            recorded = {}
        if isinstance(recorded, dict) and recorded.get("job") == job:
            return recorded
        known = recorded.get("job") if isinstance(recorded, dict) else None
        why = ("its job.json is damaged" if not isinstance(known, dict)
               else changed(known) or "it was started by another job")
        log(f"discarding the partial output {tmp}: {why}")
    for entry in tmp.iterdir():  # empties it; the directory stays, with this process's lock on it
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    (tmp / PROGRESS_DIR).mkdir()
    record = {"job": job, **layout}
    replace_file(job_path, json.dumps(record, indent=2).encode())
    return record


def read_unit(tmp: Path, unit: int, log: Callable[[str], None]) -> dict[str, np.ndarray] | None:
    """What `mark_unit` kept of a finished unit, or None when it is not done; a damaged unit file
    (truncated, garbage) is removed and reported, so that its unit is done again."""
    path = tmp / PROGRESS_DIR / f"{unit:08d}.npz"
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as f:
            return {name: np.asarray(f[name]) for name in f.files}
    except Exception:  # noqa: BLE001 - any unreadable marker means "not done"
        path.unlink(missing_ok=True)
        log(f"{path}: damaged progress file removed; its samples are done again")
        return None


def mark_unit(tmp: Path, unit: int, **arrays: np.ndarray) -> None:
    """Records unit `unit` as finished (its rows written), keeping `arrays`; atomic (rename)."""
    progress = tmp / PROGRESS_DIR
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    replace_file(progress / f"{unit:08d}.npz", buffer.getvalue())


def finish(tmp: Path) -> None:
    """Removes the bookkeeping (progress files, job.json): `tmp` is then a plain output to move into place."""
    shutil.rmtree(tmp / PROGRESS_DIR, ignore_errors=True)
    (tmp / JOB_FILE).unlink(missing_ok=True)
