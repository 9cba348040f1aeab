"""The hostile-user harness checks itself: a change it is meant to catch makes it fail, so a case can
never pass silently (tests/adversarial.py)."""

from __future__ import annotations

import subprocess

import pytest

import adversarial
from adversarial import assert_one_error_line, expect_refusal, snapshot

pytestmark = pytest.mark.slow


def _refusal(stderr: bytes, code: int = 2) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess(["jepa"], code, b"", stderr)


def test_snapshot_differs_when_a_file_changes(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"one")
    before = snapshot([tmp_path])
    (tmp_path / "a.bin").write_bytes(b"two")
    assert snapshot([tmp_path]) != before


def test_snapshot_differs_when_a_hidden_file_appears(tmp_path):
    before = snapshot([tmp_path])
    (tmp_path / ".out.zarr.partial-0123abcd").write_bytes(b"")
    assert snapshot([tmp_path]) != before


def test_snapshot_differs_when_an_empty_directory_appears(tmp_path):
    before = snapshot([tmp_path])
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    assert snapshot([tmp_path]) != before


def test_snapshot_differs_when_a_guarded_path_is_created(tmp_path):
    before = snapshot([tmp_path / "out.zarr"])
    (tmp_path / "out.zarr").mkdir()
    assert before == {str(tmp_path / "out.zarr"): ("missing",)}
    assert snapshot([tmp_path / "out.zarr"]) != before


def test_one_error_line_rejects_a_blank_line_before_the_error():
    with pytest.raises(AssertionError, match="not one line"):
        assert_one_error_line(_refusal(b"\njepa: error: bad input\n"))


def test_one_error_line_rejects_a_log_line_after_the_error():
    with pytest.raises(AssertionError, match="not one line"):
        assert_one_error_line(_refusal(b"jepa: error: bad input\nW0101 12:00:00 orbax: closing\n"))


def test_one_error_line_rejects_a_traceback():
    with pytest.raises(AssertionError, match="Traceback"):
        assert_one_error_line(_refusal(b"Traceback (most recent call last):\njepa: error: x\n"))


def test_one_error_line_rejects_another_exit_code():
    with pytest.raises(AssertionError):
        assert_one_error_line(_refusal(b"jepa: error: x\n", code=1), code=2)


def test_one_error_line_requires_every_fragment():
    with pytest.raises(AssertionError):
        assert_one_error_line(_refusal(b"jepa: error: x.zarr: missing\n"), fragments=["y.zarr"])


def test_expect_refusal_fails_when_the_refused_command_changed_a_guarded_path(tmp_path, monkeypatch):
    def refuse_but_write(*args, **kwargs):
        (tmp_path / "left-behind").write_text("partial")
        return _refusal(b"jepa: error: bad input\n")

    monkeypatch.setattr(adversarial, "run_jepa", refuse_but_write)
    with pytest.raises(AssertionError, match="changed guarded paths"):
        expect_refusal("mask", guard=[tmp_path])
