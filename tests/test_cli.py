"""The `jepa` command group: help, laziness, error convention, completion scripts."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jepa_cli.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[1]


def test_help_lists_the_commands_that_exist(run_cli):
    result = run_cli("--help")
    assert result.exit_code == 0
    for name in ("ingest", "info", "completion"):
        assert name in result.stdout


def test_help_imports_neither_jax_nor_subcommands_and_is_fast():
    code = ("import sys, time; t = time.perf_counter(); from jepa_cli.cli.main import cli\n"
            "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'jax' not in sys.modules and 'numpy' not in sys.modules, 'heavy import'\n"
            "print(time.perf_counter() - t, file=sys.stderr)")
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    assert elapsed < 1.5  # interpreter start included; the group itself takes a few ms
    assert float(result.stderr.strip().splitlines()[-1]) < 0.25


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_subcommand_help_has_a_summary_and_an_example(run_cli, name):
    result = run_cli(name, "--help")
    assert result.exit_code == 0
    assert "Example" in result.stdout
    assert COMMANDS[name][1].rstrip(".") in " ".join(result.stdout.split())


def test_unknown_command_is_one_line_exit_2(run_cli):
    result = run_cli("frobnicate")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == ["jepa: error: No such command 'frobnicate'."]


def test_jepa_debug_shows_the_traceback(tmp_path):
    env = dict(os.environ, JEPA_DEBUG="1")
    result = subprocess.run([sys.executable, "-m", "jepa_cli", "info", str(tmp_path / "missing")],
                            capture_output=True, text=True, env=env)
    assert result.returncode != 0 and "Traceback" in result.stderr


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_committed_completion_scripts_are_current(run_cli, shell):
    committed = (ROOT / "shell-completions" / f"jepa.{shell}").read_text()
    assert run_cli("completion", shell).stdout == committed, \
        f"shell-completions/jepa.{shell} is stale: regenerate with `jepa completion {shell} > shell-completions/jepa.{shell}`"
