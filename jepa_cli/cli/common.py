"""What every subcommand shares: output options, the stderr console, result printing, progress."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

import click

if TYPE_CHECKING:
    from rich.progress import Progress


SEED = click.IntRange(0, 2**32 - 1)  # the type of every --seed: what numpy and jax.random.PRNGKey accept


def output_options(func: Callable) -> Callable:
    """Adds --json, -v/--verbose and -q/--quiet."""
    func = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")(func)
    func = click.option("-v", "--verbose", count=True, callback=_library_log_level,
                        help="More logging on stderr (-v: library warnings, -vv: library info).")(func)
    func = click.option("-q", "--quiet", is_flag=True, help="No progress or logs on stderr.")(func)
    return func


def _library_log_level(ctx: click.Context, param: click.Parameter, verbose: int) -> int:
    """-v lets the libraries' (JAX, orbax, Python) warnings reach stderr, -vv their info messages too;
    without -v they are silenced (cli/main.py, quiet_libraries)."""
    if verbose:
        logging.getLogger().setLevel(logging.WARNING if verbose == 1 else logging.INFO)
    return verbose


def stderr_console(quiet: bool = False):
    """The rich console for logs and progress; stdout stays for results. Markup is off (stdout_console)."""
    from rich.console import Console

    return Console(stderr=True, quiet=quiet, markup=False)


def stdout_console():
    """The rich console for results, the one every command prints its tables through. Markup is off:
    the strings printed are the user's (paths, class names, regexes, run names) and a `[...]` in them
    is text, not a style; styles come from Text objects and column styles."""
    from rich.console import Console

    return Console(soft_wrap=True, markup=False)


def stderr_log(quiet: bool = False, console=None) -> Callable[[str], None]:
    """A `log` callback: each message one plain line on stderr (no markup, no wrapping, no rich
    source tags), nothing with --quiet. Pass the console of a live progress bar so that the line
    is printed above the bar instead of through it."""
    console = console or stderr_console(quiet)
    return lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True)


def format_duration(seconds: float) -> str:
    """12 -> '12s', 83 -> '1m23s', 7322 -> '2h02m'."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def warn(message: str, quiet: bool = False) -> None:
    """One line `jepa: warning: ...` on stderr (silenced by --quiet): the command goes on."""
    if not quiet:
        click.echo(f"jepa: warning: {' '.join(str(message).split())}", err=True)


def emit(result: dict[str, Any], as_json: bool, human: Callable[[dict[str, Any]], None] | str | None = None) -> None:
    """Prints a command's result: one JSON object with --json, else the human rendering on stdout.

    Strings pass through `store.utf8_text` first: a name that is not UTF-8 (held by Python as lone
    surrogates) is printed with `\\xNN` escapes for its bad bytes, so stdout is always valid UTF-8.
    The JSON is strict (RFC 8259, what jq reads): a NaN or infinite number (a diverged loss, the
    accuracy of an empty class) is written as null."""
    from jepa_cli.data.jsonvalues import json_value
    from jepa_cli.data.store import utf8_text

    result = utf8_text(result)
    if as_json:
        text = json.dumps(json_value(result), allow_nan=False)
        sys.stdout.write(text + "\n")
        return
    if callable(human):
        human(result)
    elif isinstance(human, str):
        click.echo(human)
    else:
        print_mapping(result)


def print_mapping(mapping: dict[str, Any], title: str | None = None) -> None:
    """A two-column table of a flat mapping on stdout."""
    from rich.table import Table

    table = Table(title=title, show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold cyan")
    table.add_column()
    for key, value in mapping.items():
        if isinstance(value, float):
            value = f"{value:.6g}"
        elif isinstance(value, (list, tuple)) and len(value) > 12:
            value = f"[{', '.join(map(str, value[:12]))}, ...] ({len(value)} items)"
        elif isinstance(value, dict):
            from jepa_cli.data.jsonvalues import json_value

            value = json.dumps(json_value(value))
        table.add_row(str(key), str(value))
    stdout_console().print(table)


class ProgressHandle:
    """Callable `advance(n)`; `set_total(n)` once the size of the work is known.

    On a terminal it moves the bar. When stderr is a file or a pipe (SLURM, nohup, `2>log`) the bar is
    not drawn; instead one plain line `DESCRIPTION: DONE/TOTAL UNIT, RATE UNIT/s, ETA` is written at
    every tenth of the total and at least every `PLAIN_EVERY_S` seconds, once the work has run for
    `PLAIN_AFTER_S`: a short command writes none, so that an error stays the only line on stderr. The
    rate and the ETA are timed from the first advance (seconds_left), so that compiling the first
    batch does not count; a line before a second advance shows neither."""

    PLAIN_AFTER_S = 10.0
    PLAIN_EVERY_S = 30.0

    def __init__(self, progress, task, unit: str, quiet: bool = False) -> None:
        self._progress, self._task, self._unit = progress, task, unit
        self._plain = not quiet and not progress.console.is_terminal
        self.log = stderr_log(quiet, progress.console)  # a plain line above the bar
        self._start = time.monotonic()
        self._lines = PlainThrottle(self._start, self.PLAIN_EVERY_S, self.PLAIN_EVERY_S, quiet_s=self.PLAIN_AFTER_S)
        self._done = 0
        self._first: tuple[int, float] | None = None  # (done, time) at the first advance: the clock's start
        self._tenth_logged = 0

    def __call__(self, n: int = 1) -> None:
        self._progress.advance(self._task, n)
        self._done += n
        if self._first is None:
            self._first = (self._done, time.monotonic())
        speed = self._progress.tasks[0].speed
        if speed:
            self._progress.update(self._task, rate=f"{speed:,.0f} {self._unit}/s")
        if self._plain:
            self._plain_line()

    def set_total(self, total: int) -> None:
        self._progress.update(self._task, total=total)

    def _plain_line(self) -> None:
        now = time.monotonic()
        total = self._progress.tasks[0].total
        tenth = int(10 * self._done / total) if total else 0
        if not self._lines.due(now, boundary=tenth > self._tenth_logged):
            return
        self._tenth_logged = max(tenth, self._tenth_logged)
        self._lines.wrote(now)
        done = f"{self._done}/{total}" if total else f"{self._done}"
        timed, seconds = self._done - self._first[0], now - self._first[1]
        rate = f", {timed / seconds:,.1f} {self._unit}/s" if timed > 0 and seconds > 0 else ""
        left = seconds_left(self._first, self._done, total, now) if total else None
        eta = f", ETA {format_duration(left)}" if left is not None else ""
        self.log(f"{self._progress.tasks[0].description}: {done} {self._unit}{rate}{eta}")


class PlainThrottle:
    """When a progress display writes its next plain line on a non-terminal stderr: at each boundary
    the display names (a new tenth of the work, every log_every updates) and, between boundaries,
    once `first_s` seconds have passed since `start` and then `every_s` seconds after the last line,
    so that a slow run still says how it goes. None at all during the first `quiet_s` seconds (a
    short command writes no line). `pace` (seconds between reports) brings a timed line forward to the
    last report before its deadline: with reports every 8 s, the first line comes at 24 s, not 32."""

    def __init__(self, start: float, first_s: float, every_s: float, quiet_s: float = 0.0) -> None:
        self.start, self.first_s, self.every_s, self.quiet_s = start, first_s, every_s, quiet_s
        self.last: float | None = None  # time of the last line

    def due(self, now: float, boundary: bool = False, pace: float = 0.0) -> bool:
        if now - self.start < self.quiet_s:
            return False
        deadline = self.start + self.first_s if self.last is None else self.last + self.every_s
        return boundary or now + pace >= deadline

    def wrote(self, now: float) -> None:
        self.last = now


def seconds_left(first: tuple[int, float], done: int, total: int, now: float) -> float | None:
    """Seconds until `total` units are done, at the mean time per unit since `first` = (units done,
    time) at the first report: what precedes that report (compiling a step) does not count. None
    before a unit was timed. Every progress display (the generic bar, jepa train's) times its ETA so."""
    timed = done - first[0]
    return (total - done) * (now - first[1]) / timed if timed > 0 else None


@contextlib.contextmanager
def progress_bar(description: str, total: int | None, unit: str, quiet: bool = False) -> Iterator[ProgressHandle]:
    """A rich progress bar on stderr with a rate in `unit`/s."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn

    columns = [
        TextColumn("{task.description}", style="progress.description", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
    ]
    with live_progress(*columns, quiet=quiet) as progress:
        yield ProgressHandle(progress, progress.add_task(description, total=total, rate=""), unit, quiet=quiet)


@contextlib.contextmanager
def live_progress(*columns, quiet: bool = False) -> Iterator[Progress]:
    """A rich Progress with `columns` on stderr, the one way commands draw progress.

    Drawn only on a terminal: a redirected stderr gets logs and errors, not redraws (a stopped live
    display there prints its last frame, a blank line when no task was added yet). An exception
    erases the bar, so that the error's one line is all that stays on stderr; so does the end of a
    display to which no task was added."""
    from rich.progress import Progress

    console = stderr_console(quiet)
    with Progress(*columns, console=console, transient=False, disable=quiet or not console.is_terminal) as progress:
        try:
            yield progress
        except BaseException:
            progress.live.transient = True
            raise
        if not progress.tasks:  # nothing to show (`jepa train --steps 0`): no empty frame left behind
            progress.live.transient = True


SPARK_BLOCKS = "▁▂▃▄▅▆▇█"


def spark_levels(values: list[float]) -> list[int]:
    """Each value's height 0..7 between the minimum and the maximum (all 0 when they are equal)."""
    lo, hi = min(values), max(values)
    top = len(SPARK_BLOCKS) - 1
    return [0 if hi == lo else round((v - lo) / (hi - lo) * top) for v in values]


def sparkline(values: list[float]) -> str:
    """`▇▆▄▃▂▁▁▁`: one block character per value."""
    return "".join(SPARK_BLOCKS[level] for level in spark_levels(values))


SHOWN_GROUPS = 5  # the ingest summary names a split's groups up to this many (all of them in --json)


def groups_phrase(summary: dict) -> str:
    """", 1 group (spk3)" / ", 12 groups": the part of an ingest summary line that says which groups
    of a grouped split the dataset holds; "" without groups."""
    if "groups" not in summary:
        return ""
    count, names = summary["groups"], summary.get("group_names") or []
    shown = f" ({', '.join(names)})" if 0 < len(names) <= SHOWN_GROUPS else ""
    return f", {count} group{'' if count == 1 else 's'}{shown}"
