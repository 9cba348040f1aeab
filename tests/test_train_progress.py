"""`jepa train`'s progress (cli/train.py TrainProgress on cli/common.py live_progress): what the bar
shows, what stays on a terminal at the end, and an ETA that does not count compiling the step."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from jepa_cli.cli import common
from jepa_cli.cli.train import TrainProgress, collapse_text


def screen(text: str) -> list[str]:
    """The lines a terminal shows after `text`: rich's live display writes \\r, \\n, erase-line
    (ESC[2K), cursor-up (ESC[1A) and cursor show/hide codes."""
    lines, row = [""], 0
    for token in re.findall(r"\x1b\[\??[0-9;]*[A-Za-z]|\r|\n|[^\x1b\r\n]+", text):
        if token == "\n":
            row += 1
            lines += [""] * (row + 1 - len(lines))
        elif token == "\r" or token.endswith(("h", "l")):
            continue
        elif token == "\x1b[2K":
            lines[row] = ""
        elif token == "\x1b[1A":
            row = max(0, row - 1)
        else:
            lines[row] += token
    return [line for line in lines if line]


@pytest.fixture
def terminal(monkeypatch):
    """stderr as a 120-column terminal; returns what was written to it."""
    written = io.StringIO()
    monkeypatch.setattr(common, "stderr_console",
                        lambda quiet=False: Console(file=written, force_terminal=True, width=120, quiet=quiet))
    return written


@pytest.fixture
def clock(monkeypatch):
    """time.perf_counter as seen by cli/train.py, set by the test."""
    now = [0.0]
    monkeypatch.setattr("jepa_cli.cli.train.time.perf_counter", lambda: now[0])
    return now


START = {"run": "r", "start_step": 0, "steps": 10, "mesh": {"data": 1}, "devices": 1, "processes": 1}


def test_the_bar_shows_the_learning_rate_and_the_effective_rank(terminal, clock):
    with common.live_progress(*TrainProgress.columns()) as progress:
        shown = TrainProgress(progress, log_every=1, batch_size=8)
        shown.on_start(START)
        shown.on_step({"step": 1, "loss": 0.5, "lr": 2e-4, "effective_rank": 12.34, "target_std": 0.2})
        fields = progress.tasks[0].fields
    assert (fields["loss"], fields["lr"], fields["collapse"]) == ("0.5000", "lr 2.00e-04", "rank 12.3")
    assert "lr 2.00e-04 rank 12.3" in screen(terminal.getvalue())[-1]


def test_without_an_effective_rank_the_bar_shows_the_feature_std():
    assert collapse_text({"target_std": 0.01234, "repr_std": 0.5}) == "std 0.0123"
    assert collapse_text({"repr_std": 0.5}) == "std 0.5"
    assert collapse_text({"loss": 1.0}) == ""


def test_the_eta_is_timed_from_the_first_update_so_compilation_does_not_count(terminal, clock):
    with common.live_progress(*TrainProgress.columns()) as progress:
        shown = TrainProgress(progress, log_every=1, batch_size=8)
        shown.on_start(START)
        clock[0] = 600.0  # the first update's report comes after 10 minutes of compilation
        shown.on_step({"step": 1, "loss": 0.5})
        assert progress.tasks[0].fields["eta"] == ""  # one report times nothing yet
        clock[0] = 602.0
        shown.on_step({"step": 2, "loss": 0.5})
        clock[0] = 604.0
        shown.on_step({"step": 3, "loss": 0.5})
        assert progress.tasks[0].fields["eta"] == "ETA 14s"  # 7 updates left at 2 s each


def test_plain_lines_time_their_rate_from_the_first_update(monkeypatch, clock):
    written = io.StringIO()
    monkeypatch.setattr(common, "stderr_console", lambda quiet=False: Console(file=written, width=200, quiet=quiet))
    with common.live_progress(*TrainProgress.columns()) as progress:
        shown = TrainProgress(progress, log_every=2, batch_size=8)
        shown.on_start(START)
        for step, now in ((1, 600.0), (2, 602.0), (3, 604.0), (4, 606.0)):
            clock[0] = now
            shown.on_step({"step": step, "loss": 0.5, "lr": 1e-3})
    assert written.getvalue().splitlines()[1:] == ["step 2/10 loss 0.5000 lr 1.00e-03 4 ex/s ETA 16s",
                                                   "step 4/10 loss 0.5000 lr 1.00e-03 4 ex/s ETA 12s"]


def test_a_run_of_no_update_leaves_only_its_run_line_on_the_terminal(terminal):
    with common.live_progress(*TrainProgress.columns()) as progress:
        TrainProgress(progress, log_every=1, batch_size=8).on_start({**START, "steps": 0})
    assert screen(terminal.getvalue()) == ["run r: steps 0 -> 0, mesh {'data': 1}, 1 devices, 1 process(es)"]


def test_an_error_during_training_erases_the_bar(terminal, clock):
    with pytest.raises(RuntimeError):
        with common.live_progress(*TrainProgress.columns()) as progress:
            shown = TrainProgress(progress, log_every=1, batch_size=8)
            shown.on_start(START)
            shown.on_step({"step": 1, "loss": 0.5})
            raise RuntimeError("diverged")
    assert screen(terminal.getvalue()) == ["run r: steps 0 -> 10, mesh {'data': 1}, 1 devices, 1 process(es)"]
