"""Shell completion that knows this toolkit's files: run directories, datasets, checkpoint steps and
built-in sources. Each function is a click `shell_complete` callback; none imports JAX, so completing
stays about as fast as `jepa --help`."""

from __future__ import annotations

import os
from pathlib import Path

import click
from click.shell_completion import CompletionItem

from jepa_cli.names import BUILTIN_SOURCES


def _entries(incomplete: str) -> list[tuple[str, Path]]:
    """(completion text, path) of the folders whose path extends `incomplete`."""
    head, sep, prefix = incomplete.rpartition("/")
    base = Path(head + sep) if sep else Path(".")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    hidden_ok = prefix.startswith(".")
    return [(head + sep + name, base / name) for name in names
            if name.startswith(prefix) and (hidden_ok or not name.startswith(".")) and _typeable(name)
            and (base / name).is_dir()]


def _typeable(name: str) -> bool:
    """False for a name that is not valid UTF-8 (held as lone surrogates): the shell protocol is UTF-8
    text, and such a name cannot be offered, so it is left out instead of failing the completion."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _folders_and(kind_test, incomplete: str) -> list[CompletionItem]:
    """Folders that pass `kind_test` as themselves, and plain folders (neither a run nor a dataset)
    with a trailing / to descend into."""
    items = []
    for text, path in _entries(incomplete):
        if kind_test(path):
            items.append(CompletionItem(text))
        elif not (is_run(path) or is_dataset(path)):
            items.append(CompletionItem(text + "/"))
    return items


def is_run(path: Path) -> bool:
    return (path / "run.json").is_file()


def is_dataset(path: Path) -> bool:
    return (path / "zarr.json").is_file()


def complete_runs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Run directories (folders holding run.json)."""
    return _folders_and(is_run, incomplete)


def complete_runs_or_datasets(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """What `jepa info` describes: runs and datasets (mask files too: the shell's own file completion)."""
    return _folders_and(lambda path: is_run(path) or is_dataset(path), incomplete)


def complete_datasets(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Datasets and embedding sets (folders holding a zarr.json)."""
    return _folders_and(is_dataset, incomplete)


def complete_sources(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """`builtin:` names, then files and folders (the shell's own)."""
    if incomplete.startswith("b"):
        names = [f"builtin:{name}" for name in BUILTIN_SOURCES if f"builtin:{name}".startswith(incomplete)]
        if names:
            return [CompletionItem(name) for name in names]
    return [CompletionItem(incomplete, type="file")]


def complete_recipes(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """`builtin:` recipes (jepa_cli/recipes/*.toml), then files (the shell's own)."""
    from jepa_cli.training.config import BUILTIN_PREFIX, builtin_recipes

    if incomplete.startswith("b"):
        names = [BUILTIN_PREFIX + name for name in builtin_recipes() if (BUILTIN_PREFIX + name).startswith(incomplete)]
        if names:
            return [CompletionItem(name) for name in names]
    return [CompletionItem(incomplete, type="file")]


def _run_on_line(ctx: click.Context) -> str | None:
    """The RUN of the command being completed. click fills ctx.params only up to a word it cannot
    parse yet (a trailing `--step` stops it before the positional RUN), so the words the shell passes
    in COMP_WORDS (bash, zsh and fish alike) are searched for a run directory too."""
    run = ctx.params.get("run") or ctx.params.get("run_dir")
    if run:
        return run
    from click.shell_completion import split_arg_string

    return next((word for word in split_arg_string(os.environ.get("COMP_WORDS", "")) if is_run(Path(word))), None)


def complete_steps(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The checkpoint steps of the RUN given earlier on the line (argument `run` or option --run)."""
    from jepa_cli.training.runfiles import checkpoint_steps  # no JAX there (NumPy only)

    run = _run_on_line(ctx)
    steps = [str(step) for step in checkpoint_steps(run)] if run else []
    if param.metavar == "N|all":
        steps.append("all")
    return [CompletionItem(step) for step in steps if step.startswith(incomplete)]
