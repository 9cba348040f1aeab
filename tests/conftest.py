"""Shared test helpers. Tests run JAX on the CPU; 8 simulated devices let sharding tests run on CPU."""

import os

# Must be set before JAX initialises its backend (docs/distributed.md): every test sees 8 CPU devices.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent XLA cache for the whole run (both xdist workers and every `jepa` subprocess), inside
# the checkout rather than the user's ~/.cache: the many tiny runs of the same configuration then
# compile once. The CLI sets JAX's variables from JEPA_CACHE_DIR (cli/main.py); this process sets them
# the same way below, before anything imports JAX.
os.environ.setdefault("JEPA_CACHE_DIR", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                     ".pytest_cache", "jepa-xla"))

import pytest
from click.testing import CliRunner

from jepa_cli.cli.main import use_compilation_cache

use_compilation_cache(os.environ)


class CliResult:
    """Exit code, stdout and stderr of one `jepa` invocation."""

    def __init__(self, exit_code: int, stdout: str, stderr: str) -> None:
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr


@pytest.fixture
def run_cli():
    """Runs `jepa ARGS...` in-process; returns a CliResult."""
    from jepa_cli.cli.main import cli

    def run(*args: str, env: dict | None = None) -> CliResult:
        result = CliRunner().invoke(cli, [str(a) for a in args], env=env, catch_exceptions=False, prog_name="jepa")
        return CliResult(result.exit_code, result.stdout, result.stderr)

    return run


def assert_user_error(result: CliResult, *fragments: str) -> None:
    """Exit 2, exactly one line on stderr starting `jepa: error:`, naming every fragment, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("jepa: error: ")
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
