"""Code, tests and user pages say what things do and why, never how they came to be: history lives in
git log, dated measurements in benchmarks/NOTES.md, and nothing points outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Words that narrate: the project's tracker numbers (an official repository's "issue #60" names a public
# page and stays), sessions, first-person lab notes, commit pins of this project, and outside folders.
NARRATION = re.compile(
    r"\b(issue[- ]\d+|issue's|this[ ]session|earlier[ ]sessions?|I[ ](ran|measured|added|tried|found|fixed)|"
    r"used to (run|be|take|crash|fail|print|write|read|give|say|keep)|main at [0-9a-f]{7}|until the sweep)\b"
    r"|shared/[r]eference|/wor[k]/", re.IGNORECASE)
CHECKED = ("jepa_cli", "tests", "docs", "recipes", "scripts", "benchmarks", "README.md", "Makefile", ".ci")


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--", *CHECKED], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    paths = [ROOT / name for name in listed.stdout.splitlines()]
    skipped = {ROOT / "benchmarks" / "NOTES.md", Path(__file__).resolve()}
    return [p for p in paths if p not in skipped and p.suffix in {".py", ".md", ".toml", ".mk", ".sh", ".bash", ""}
            and p.is_file()]


def test_no_file_narrates_its_history_or_points_outside_the_repository():
    found = []
    for path in _tracked_text_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if NARRATION.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert found == []


def test_the_pattern_catches_narration_and_spares_a_public_issue():
    assert NARRATION.search("# as issue-14 asked")
    assert NARRATION.search("which used to crash")
    assert NARRATION.search("see ../" + "shared/reference/official-recipes.md")
    assert not NARRATION.search("facebookresearch/ijepa issue #60: randint(0, H - h)")
