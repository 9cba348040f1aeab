"""The probe results that `jepa probe ... --json > FILE.json` left in files, found again for `jepa runs`
(docs/formats.md, "Runs and checkpoints").

A file is a probe result when it is one JSON object with `"probe"` one of PROBE_KINDS and either an
`encoder` (a probe of encode-latents embeddings: `encoder.run` is the run's absolute path, `encoder.step`
its checkpoint) or a `run` and `results` (`jepa probe --run RUN`: one row per checkpoint step; a relative
RUN is taken from the current folder). Only probes of the target encoder count, the encoder the
training-time probe scores. Any other file, JSON or not, is passed over.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable

PROBE_KINDS = ("knn", "linear", "attentive")
MAX_BYTES = 1 << 24  # a probe result is a few kB; a larger .json is some other file, left unread


def figure_keys(kind: str) -> tuple[str, str]:
    """The names a probe kind's figures take in a run's row: `knn_top1`, `knn_top5`."""
    return f"{kind}_top1", f"{kind}_top5"


def read_probe_file(path: Path) -> list[dict[str, Any]]:
    """The probe results in the file at `path`: [{"run": absolute path, "step", "probe", "top1", "top5",
    "file"}, ...]; [] for a file that is not a probe result."""
    try:
        if path.stat().st_size > MAX_BYTES:
            return []
        record = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return []
    if not isinstance(record, dict) or record.get("probe") not in PROBE_KINDS:
        return []
    if isinstance(record.get("encoder"), dict):
        encoder = record["encoder"]
        if encoder.get("weights", "target") != "target":
            return []
        rows = [{"run": encoder.get("run"), "step": encoder.get("step"), "top1": record.get("top1"),
                 "top5": record.get("top5")}]
    elif isinstance(record.get("run"), str) and isinstance(record.get("results"), list):
        if record.get("weights", "target") != "target":
            return []
        rows = [{"run": record["run"], "step": row.get("step"), "top1": row.get("top1"), "top5": row.get("top5")}
                for row in record["results"] if isinstance(row, dict)]
    else:
        return []
    found = []
    for row in rows:
        if not isinstance(row["run"], str) or not _is_step(row["step"]) or not _figure(row["top1"]):
            continue
        found.append({**row, "run": str(Path(row["run"]).resolve()), "probe": record["probe"],
                      "top5": row["top5"] if _figure(row["top5"]) else None, "file": str(path)})
    return found


def probe_results(folders: Iterable[Path], recursive: Iterable[Path] = ()) -> list[dict[str, Any]]:
    """Every probe result in the `.json` files directly in `folders` and at any depth below `recursive`
    (folders starting with "." skipped), each file read once."""
    files: dict[Path, None] = {}
    for folder in folders:
        if folder.is_dir():
            files.update(dict.fromkeys(sorted(folder.glob("*.json"))))
    for folder in recursive:
        files.update(dict.fromkeys(sorted(p for p in folder.rglob("*.json")
                                          if not any(part.startswith(".") for part in p.relative_to(folder).parts))))
    return [row for path in files if path.is_file() for row in read_probe_file(path)]


def _is_step(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _figure(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
