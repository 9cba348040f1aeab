"""The declared mutations of scripts/mutants.py (`make mutants`) stay applicable: each original text
occurs exactly once in its file, each mutation changes it, and each names tests that exist."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _mutants():
    spec = importlib.util.spec_from_file_location("mutants", ROOT / "scripts" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_every_declared_original_text_occurs_exactly_once_in_its_file():
    mutants = _mutants()
    assert len(mutants.MUTATIONS) >= 30
    for m in mutants.MUTATIONS:
        assert (ROOT / m.file).read_text().count(m.original) == 1, (m.file, m.original)
        assert m.mutated != m.original, m.file
    assert mutants.check_declared() == []


def test_every_named_test_file_and_test_exists():
    for m in _mutants().MUTATIONS:
        for target in m.tests:
            path, _, name = target.partition("::")
            assert (ROOT / path).is_file(), target
            if name:
                assert f"def {name}(" in (ROOT / path).read_text(), target


@pytest.mark.slow
def test_a_stale_declaration_is_reported_with_its_count(tmp_path):
    mutants = _mutants()
    (tmp_path / "a.py").write_text("x = 1\nx = 1\n")
    declared = (mutants.Mutation("a.py", "x = 1", "x = 2", ("t.py",), "twice"),
                mutants.Mutation("a.py", "y = 1", "y = 2", ("t.py",), "never"))
    assert mutants.check_declared(tmp_path, declared) == ["a.py: 'x = 1' occurs 2 times (must be once)",
                                                          "a.py: 'y = 1' occurs 0 times (must be once)"]
