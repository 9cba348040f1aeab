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
    r"used to (run|be|take|crash|fail|print|write|read|give|say|keep)|main at [0-9a-f]{7}|until the sweep|"
    r"a scratch cop(y|ies)|an? earlier version|(what )?(was|were) tried|the next step|we then|"
    r"(where|when) the issue (left|was)|stays as it was|a later run under|"
    r"(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth) session)\b"
    r"|shared/[r]eference|/wor[k]/", re.IGNORECASE)
# Pages for users and the dated log also name no machine's folders: a temporary or home directory is
# where one run happened, not where a reader's files are (scripts and tests may use /tmp in examples).
MACHINE_PATHS = re.compile(r"(?<![\w.])(/tm[p]/|/hom[e]/\w)")
CHECKED = ("jepa_cli", "tests", "docs", "recipes", "scripts", "benchmarks", "README.md", "Makefile", ".ci",
           "pyproject.toml")
NOTES = ROOT / "benchmarks" / "NOTES.md"


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--", *CHECKED], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    paths = [ROOT / name for name in listed.stdout.splitlines()]
    skipped = {NOTES, Path(__file__).resolve()}
    return [p for p in paths if p not in skipped and p.suffix in {".py", ".md", ".toml", ".mk", ".sh", ".bash", ""}
            and p.is_file()]


def _lines(path: Path):
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        yield f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}", line


@pytest.mark.slow
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


def test_the_benchmark_log_is_dated_entries_without_narration_or_machine_paths():
    """benchmarks/NOTES.md keeps figures, not the story of the sessions that measured them."""
    if not NOTES.is_file():
        pytest.skip("no benchmarks/NOTES.md")
    found = [where for where, line in _lines(NOTES) if NARRATION.search(line) or MACHINE_PATHS.search(line)]
    assert found == []


@pytest.mark.slow
def test_user_pages_name_no_machine_paths():
    pages = [p for p in _tracked_text_files() if p.suffix == ".md"]
    found = [where for page in pages for where, line in _lines(page) if MACHINE_PATHS.search(line)]
    assert found == []


def test_the_pattern_catches_lab_notebook_phrases():
    for phrase in ("(a scratch copy, not an option)", "An earlier version that chose guided steps",
                   "### Moving MNIST's digits: what was tried", "in the eighth session's run",
                   "Decisions where the issue left a choice:", "so that the image command stays as it was",
                   "we then ran it again", "the next step is a GPU run", "A later run under a load of 9"):
        assert NARRATION.search(phrase), phrase
    assert MACHINE_PATHS.search("make bench REFERENCE=/tmp/ijepa-ref")
    assert MACHINE_PATHS.search("see /home/alice/runs")
    assert not MACHINE_PATHS.search("jepa's own JEPA_CACHE_DIR, not the user's ~/.cache")
    assert not NARRATION.search("the next update's step size")
