"""RUN on disk, without JAX: its file names, run.json (read, with what an older one leaves unsaid,
and written), metrics.jsonl's rows, the lock a trainer holds on RUN and the steps of its complete
checkpoints (docs/formats.md, "Runs")."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from jepa_cli.data.files import DamagedFile, read_json, read_jsonl, replace_file
from jepa_cli.data.jsonvalues import json_value
from jepa_cli.data.locks import Lock, make_lock
from jepa_cli.data.urls import bucket_run_refusal, is_bucket
from jepa_cli.errors import InputError

RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
LOCK_FILE = ".lock"
# The objectives whose options include the model's LayerNorm epsilon `norm_eps`. A config saved without
# it describes a model built with eps 1e-6 (models/layers.NORM_EPS), whatever the objective's default.
NORM_EPS_OBJECTIVES = ("ijepa", "vjepa", "audio-jepa", "lejepa")
SAVED_NORM_EPS = 1e-6


def run_lock(run_dir: str | Path) -> Lock:
    """The exclusive lock a trainer holds on RUN: RUN/.lock, holding the holder's pid (data/locks.py,
    gone with its holder however it exits). A second trainer gets busy_run, naming the holder."""
    return make_lock(Path(run_dir) / LOCK_FILE, refusal=lambda holder: busy_run(run_dir, holder), pid_file=True)


def busy_run(run_dir: str | Path, holder: str) -> InputError:
    """The refusal of a command that would write RUN while process `holder` trains in it."""
    return InputError(f"{run_dir}: another process (pid {holder}) is training in this run; wait for it to finish "
                      "or stop it")


def run_identity(run_dir: str | Path) -> tuple[int, int, int] | None:
    """Which run.json RUN holds now: (inode, mtime ns, size), changed by every write of it (write_run
    replaces the file); None without one. Tells a run another process wrote since a first look."""
    try:
        info = os.stat(Path(run_dir) / RUN_FILE)
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_size


def is_step_name(name: str) -> bool:
    """Whether a checkpoint folder's `name` is a step: ASCII decimal digits only ('²' is a digit to
    str.isdigit, yet no int)."""
    return name.isascii() and name.isdecimal()


def checkpoint_steps(run_dir: str | Path) -> list[int]:
    """The steps of RUN's complete checkpoints (orbax's temporary directories are not steps)."""
    check_local_run(run_dir)
    ckpt_dir = Path(run_dir) / "checkpoints"
    if not ckpt_dir.is_dir():
        return []
    return sorted(int(p.name) for p in ckpt_dir.iterdir() if is_step_name(p.name) and p.is_dir())


def check_local_run(run_dir: str | Path) -> None:
    """InputError (one line) for a run given as a bucket URL to a command that reads runs (urls.bucket_run_refusal)."""
    if is_bucket(run_dir):
        raise bucket_run_refusal(run_dir)


def read_run(run_dir: str | Path) -> dict[str, Any]:
    check_local_run(run_dir)
    path = Path(run_dir) / RUN_FILE
    if not path.exists():
        raise InputError(f"{run_dir}: not a training run (no {RUN_FILE})")
    return parse_run(lambda: read_json(path), path)


def parse_run(load: Callable[[], Any], path: str | Path) -> dict[str, Any]:
    """The run.json record `load()` reads from `path` (a file, or an object of a bucket run), with what
    an older one leaves unsaid filled in (saved_config); InputError when it is damaged."""
    why = ""
    try:
        record = load()
    except DamagedFile as exc:
        record, why = None, f"{exc.reason}; "
    if not (isinstance(record, dict) and isinstance(record.get("config"), dict)
            and isinstance(record.get("lengths"), dict)):
        raise InputError(f"{path}: damaged ({why}not the JSON object with 'config' and 'lengths' that jepa train "
                         "writes); each checkpoint keeps a copy in checkpoints/<step>/config/")
    return {**record, "config": saved_config(record["config"])}


def saved_config(config: dict[str, Any]) -> dict[str, Any]:
    """A resolved config as saved in run.json or with a checkpoint, with what it leaves unsaid spelled
    out: options a model was built with that the config does not name get the value it was built
    with (`norm_eps` 1e-6), not the objective's default. A copy; `config` is not changed."""
    objective_config = config.get("objective_config")
    if config.get("objective") in NORM_EPS_OBJECTIVES and isinstance(objective_config, dict) \
            and "norm_eps" not in objective_config:
        return {**config, "objective_config": {**objective_config, "norm_eps": SAVED_NORM_EPS}}
    return config


def write_run(run_dir: str | Path, record: dict[str, Any]) -> None:
    replace_file(Path(run_dir) / RUN_FILE, json.dumps(json_value(record), indent=2, allow_nan=False).encode())


def read_metrics(run_dir: str | Path, last: int | None = None) -> list[dict[str, Any]]:
    """The rows of RUN/metrics.jsonl (the `last` lines of it when given); a line that is not a row
    (cut short by a kill, not UTF-8 JSON, without an integer step) is skipped, as on resume."""
    check_local_run(run_dir)
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    lines = read_jsonl(path)
    if last is not None:
        lines = lines[-last:]
    out = []
    for _line, row in lines:
        if isinstance(row, dict) and isinstance(row.get("step"), int) and not isinstance(row["step"], bool):
            out.append(row)  # anything else is not a row this trainer wrote
    return out


def requested_steps(run_dir: str | Path, step: int | str | None) -> list[int | None]:
    """The checkpoint steps a command asked for `step` works through: every complete one, oldest
    first, for "all"; else [step] (None: the newest that reads back). InputError when `run_dir` is no
    run, or holds no checkpoint to give "all" of."""
    run_dir = Path(run_dir)
    if not (run_dir / RUN_FILE).exists():
        raise InputError(f"{run_dir}: not a training run (no {RUN_FILE})")
    steps: list[int | None] = list(checkpoint_steps(run_dir)) if step == "all" else [step]
    if not steps:
        raise InputError(f"{run_dir}: holds no checkpoint yet")
    return steps
