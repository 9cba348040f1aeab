"""The `jepa` command group: help, laziness, error convention, completion scripts."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jepa_cli.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[1]


def test_help_lists_the_commands_that_exist(run_cli):
    result = run_cli("--help")
    assert result.exit_code == 0
    for name in ("ingest", "info", "completion"):
        assert name in result.stdout


@pytest.mark.slow
def test_help_imports_neither_jax_nor_numpy():
    # what keeps `jepa --help` and completion fast; its time is not asserted (the machine's load is)
    code = ("import sys; from jepa_cli.cli.main import cli\n"
            "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('jax', 'numpy', 'tensorstore', 'flax') if m in sys.modules)\n"
            "assert not heavy, heavy")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


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


@pytest.mark.slow
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


def _env_report(**variables: str) -> dict:
    """`jepa env --json` on the CPU with `variables`."""
    import json

    env = {**os.environ, "JAX_PLATFORMS": "cpu", **variables}
    result = subprocess.run([sys.executable, "-m", "jepa_cli", "env", "--json"], capture_output=True, text=True,
                            env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.slow
def test_env_reports_the_backend_devices_and_versions():
    report = _env_report(XLA_FLAGS="--xla_force_host_platform_device_count=3")
    assert (report["backend"], report["device_count"], report["process_count"]) == ("cpu", 3, 1)
    assert [d["id"] for d in report["devices"]] == [0, 1, 2]
    import jax

    assert report["versions"]["jax"] == jax.__version__


@pytest.mark.slow
def test_env_says_why_simulated_devices_get_no_compilation_cache():
    report = _env_report(XLA_FLAGS="--xla_force_host_platform_device_count=3", JEPA_CACHE_DIR="/tmp/unused")
    assert report["compilation_cache"] is None
    assert report["compilation_cache_off"].startswith("3 simulated CPU devices in one process")


@pytest.mark.slow
def test_env_reports_the_cache_jax_uses_a_users_own_included(tmp_path):
    report = _env_report(XLA_FLAGS="--xla_force_host_platform_device_count=3",
                         JAX_COMPILATION_CACHE_DIR=str(tmp_path / "mine"))
    assert report["compilation_cache"] == str(tmp_path / "mine")
    assert "compilation_cache_off" not in report


@pytest.mark.slow
def test_a_signal_whose_exception_a_callback_swallowed_still_stops_the_commit(tmp_path):
    # SIGTERM landing inside JAX's gc hook or a __del__: Python only prints "Exception ignored" and
    # the work goes on; the atomic write must still not move its result into place
    code = ("import sys\n"
            "from jepa_cli import errors\n"
            "from jepa_cli.data import atomic\n"
            "class Swallow:\n"
            "    def __del__(self):\n"
            "        errors.raise_terminated(15, None)  # what the SIGTERM handler does, inside a __del__\n"
            "try:\n"
            "    with atomic.atomic_directory(sys.argv[1], False, 'dataset') as tmp:\n"
            "        (tmp / 'zarr.json').write_text('{}')\n"
            "        Swallow()\n"
            "        print('work went on')\n"
            "except errors.Terminated:\n"
            "    print('terminated before the commit')\n")
    out = tmp_path / "d.zarr"
    result = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True)
    assert result.stdout.splitlines() == ["work went on", "terminated before the commit"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_sigterm_after_the_output_is_in_place_says_the_output_is_whole(tmp_path):
    code = ("import os, signal, sys\n"
            "from jepa_cli.data import atomic\n"
            "from jepa_cli.cli.main import cli\n"
            "original = atomic.move_into_place\n"
            "def move_then_signal(*args, **kwargs):\n"
            "    original(*args, **kwargs)\n"
            "    os.kill(os.getpid(), signal.SIGTERM)  # lands once the output is in place\n"
            "atomic.move_into_place = move_then_signal\n"
            "cli.main(sys.argv[1:])\n")
    out = tmp_path / "digits.zarr"
    result = subprocess.run([sys.executable, "-c", code, "ingest", "builtin:digits", str(out), "-q"],
                            capture_output=True, text=True)
    assert result.returncode == 143
    assert result.stderr.splitlines() == [f"jepa: error: terminated (SIGTERM) after {out} was written in full"]
    from jepa_cli.data import store

    assert store.read_array(out / "inputs").shape == (1797, 8, 8, 1)


@pytest.mark.slow
def test_a_sigterm_after_a_picture_is_in_place_says_the_picture_is_whole(tmp_path):
    code = ("import os, signal, sys\n"
            "from jepa_cli.data import atomic\n"
            "from jepa_cli.cli.main import cli\n"
            "original = atomic.write_file\n"
            "def write_then_signal(*args, **kwargs):\n"
            "    original(*args, **kwargs)\n"
            "    os.kill(os.getpid(), signal.SIGTERM)  # lands once the picture is in place\n"
            "atomic.write_file = write_then_signal\n"
            "cli.main(sys.argv[1:])\n")
    png = tmp_path / "m.png"
    result = subprocess.run([sys.executable, "-c", code, "mask", "--grid", "8x8", "--batch-size", "2", "--png", str(png)],
                            capture_output=True, text=True)
    assert result.returncode == 143
    assert result.stderr.splitlines() == [f"jepa: error: terminated (SIGTERM) after {png} was written in full"]
    assert png.read_bytes().startswith(b"\x89PNG")


def test_a_signal_an_earlier_command_in_the_process_received_does_not_stop_a_later_one(run_cli):
    """In one process (a notebook, the test suite) a SIGTERM that reached an earlier command is that
    command's: `--help` (click's Exit) afterwards still exits 0, not 143."""
    import signal

    from jepa_cli.errors import Terminated, raise_terminated

    with pytest.raises(Terminated):
        raise_terminated(signal.SIGTERM, None)  # as a first command's handler did
    result = run_cli("completion", "--help")
    assert result.exit_code == 0 and "Usage: jepa completion" in result.stdout, result.stderr
