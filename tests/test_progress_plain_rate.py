"""The generic progress bar's plain lines (cli/common.py ProgressHandle, used by encode-latents, the
probes, sample): their rate and ETA are timed from the first completed unit, so that compiling the
first batch does not count, as `jepa train`'s bar does (common.seconds_left)."""

from __future__ import annotations

import pytest

from jepa_cli.cli import common


@pytest.fixture
def clock(monkeypatch):
    """time.monotonic as seen by cli/common.py, set by the test."""
    now = [0.0]
    monkeypatch.setattr("jepa_cli.cli.common.time.monotonic", lambda: now[0])
    return now


def test_the_plain_rate_and_eta_leave_out_the_time_before_the_first_batch(capsys, monkeypatch, clock):
    monkeypatch.setattr(common.ProgressHandle, "PLAIN_EVERY_S", 0.0)  # a line at every advance
    with common.progress_bar("encoding", 100, "images") as advance:
        clock[0] = 600.0  # the first batch of 10 comes back after 10 minutes of compilation
        advance(10)
        clock[0] = 602.0  # then 10 images every 2 s
        advance(10)
        clock[0] = 604.0
        advance(10)
    assert capsys.readouterr().err.splitlines() == [
        "encoding: 10/100 images",  # one batch times nothing yet
        "encoding: 20/100 images, 5.0 images/s, ETA 16s",
        "encoding: 30/100 images, 5.0 images/s, ETA 14s",
    ]


def test_a_plain_line_comes_at_each_new_tenth_or_after_plain_every_s_and_not_otherwise(capsys, clock):
    # the defaults: nothing before 10 s, then a line when a new tenth is reached or 30 s after the last line
    with common.progress_bar("encoding", 100, "images") as advance:
        clock[0] = 11.0
        advance(10)  # a new tenth, 11 s after the start
        clock[0] = 15.0
        advance(10)  # a new tenth, 4 s after the last line
        clock[0] = 20.0
        advance(1)  # the same tenth, 5 s after the last line: no line
        clock[0] = 45.0
        advance(1)  # the same tenth, 30 s after the last line
    assert capsys.readouterr().err.splitlines() == [
        "encoding: 10/100 images",
        "encoding: 20/100 images, 2.5 images/s, ETA 32s",  # 10 in 4 s; 80 left
        "encoding: 22/100 images, 0.4 images/s, ETA 3m41s",  # 12 in 34 s; 78 x 34 / 12 = 221 s
    ]


def test_seconds_left_counts_from_the_first_report():
    assert common.seconds_left((1, 600.0), 3, 10, 604.0) == 14.0  # 2 updates in 4 s, 7 left
    assert common.seconds_left((1, 600.0), 1, 10, 600.0) is None  # nothing timed yet
