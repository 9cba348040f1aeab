"""The integrity record of a checkpoint step: `<step>/jepa_digest.json`, the SHA-256 of every file of
the step's items, written once the step is committed and compared with the files before they are
read (training/checkpoint.py)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from jepa_cli.data.files import read_json, replace_file

ITEMS = ("state", "data", "config", "versions")  # the items of a step (orbax item names), each a folder
DIGEST_FILE = "jepa_digest.json"  # <step>/<this>: {"algorithm": "sha256", "files": {relative path: hex digest}}


def sha256_of(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (hex), read in blocks of 4 MiB."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _file_digests(step_dir: Path) -> dict[str, str]:
    """{path relative to step_dir: SHA-256} of every file under the step's items (state, data, config,
    versions). FileNotFoundError when the step disappears meanwhile."""
    paths = [Path(root) / name for item in ITEMS if (step_dir / item).is_dir()
             for root, _dirs, files in os.walk(step_dir / item) for name in files]
    digests = [sha256_of(path) for path in paths]
    if not step_dir.is_dir():
        raise FileNotFoundError(str(step_dir))
    return dict(sorted((str(p.relative_to(step_dir)), d) for p, d in zip(paths, digests)))


def write_digest(step_dir: str | Path) -> None:
    """Writes step_dir/DIGEST_FILE (files.replace_file) for a committed step."""
    step_dir = Path(step_dir)
    record = {"algorithm": "sha256", "files": _file_digests(step_dir)}
    replace_file(step_dir / DIGEST_FILE, json.dumps(record, indent=1).encode())


def digest_problem(step_dir: str | Path) -> str | None:
    """Why the step's files do not match their digest, or None when they do or when the step has no
    digest. A file the digest lists that is missing or whose bytes changed is named; files it does
    not list are not read by anything and are ignored. FileNotFoundError when the step disappears."""
    step_dir = Path(step_dir)
    path = step_dir / DIGEST_FILE
    try:
        record = read_json(path)
    except FileNotFoundError:
        if not step_dir.is_dir():
            raise
        return None
    except (ValueError, OSError):
        record = None
    files = record.get("files") if isinstance(record, dict) and record.get("algorithm") == "sha256" else None
    if not (isinstance(files, dict) and all(isinstance(v, str) for v in files.values())):
        return f"{path} is damaged (remove it to read the step unchecked)"
    found = _file_digests(step_dir)
    for name, digest in files.items():
        if name not in found:
            return f"{name} is missing"
        if found[name] != digest:
            return f"{name} does not match its SHA-256 in {DIGEST_FILE}"
    return None
