"""docs/reference/ is generated from each subcommand's --help: a changed option makes its page stale."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from make_reference import stale  # noqa: E402


def test_every_reference_page_matches_its_help():
    assert stale() == [], "run: python scripts/make_reference.py"
