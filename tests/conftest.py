"""Shared test helpers. Tests run JAX on the CPU; 8 simulated devices let sharding tests run on CPU."""

import contextlib
import os
from pathlib import Path

import pytest
from click.testing import CliRunner


# XLA's LLVM backend at optimisation level 0 and its older (non-MLIR) fusion emitters for every JAX
# process the suite starts: the suite compiles hundreds of tiny programs and runs each a few times, and
# these settings compile them with about 2.5x less CPU, while the steps run about 2.5x slower
# (benchmarks/NOTES.md, "The test suite").
COMPILE_FASTER = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
# Must be set before JAX initialises its backend (docs/distributed.md): every test sees 8 CPU devices.
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {COMPILE_FASTER}")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The suite's `jepa` subprocesses that run on one device share one persistent XLA cache inside the
# checkout (jepa's own JEPA_CACHE_DIR, not the user's ~/.cache). Processes that simulate several CPU
# devices, this one included, keep none, as `jepa` itself does (cli/compile_cache.py, compilation_cache_dir):
# a training step whose all-reduces were loaded from the cache deadlocks (XLA aborts the process after
# 40 s). The price is the compiles one test repeats of another's: 59 of 1,476 in the heaviest
# in-process files, about a tenth of their CPU (benchmarks/NOTES.md, "Test compiles on public JAX").
CACHE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".pytest_cache", "jepa-xla")
os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)  # a developer's own setting: the deadlock above
os.environ.setdefault("JEPA_CACHE_DIR", CACHE_DIR)


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


def read_zarr(path: Path):
    """The whole array at `path` (a zarr v3 array written by jepa) as numpy."""
    import tensorstore as ts

    return ts.open({"driver": "zarr3", "kvstore": f"file://{path}"}).result().read().result()


def zarr_attributes(path: Path) -> dict:
    """The attributes of the zarr group at `path` (its zarr.json)."""
    import json

    return json.loads((path / "zarr.json").read_text())["attributes"]


def nothing_written(parent: Path, name: str) -> bool:
    """No `name` in `parent`, and none of the hidden partials (`.name.*`) that atomic writes stage there."""
    return not any(p.name == name or p.name.startswith(f".{name}.") for p in parent.iterdir())


@contextlib.contextmanager
def file_size_limit(size: int):
    """Inside the block this process may not write a file past `size` bytes: the write fails with
    EFBIG as on a full disk (SIGXFSZ ignored, so it is an OSError, not the end of the process)."""
    import resource
    import signal

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def assert_user_error(result: CliResult, *fragments: str) -> None:
    """Exit 2, exactly one line on stderr starting `jepa: error:`, naming every fragment, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("jepa: error: ")
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


# The heaviest test files first (measured on this project's 2-core machine with a cold compilation
# cache: each spends 1-4 minutes in module fixtures and calls). pyproject's --no-loadscope-reorder makes
# xdist hand out files in this order instead of by test count, so that no long file starts last and
# leaves one worker running alone at the end.
HEAVY_FIRST = ("test_objective_audio_jepa.py", "test_multiprocess.py", "test_recipes_make.py", "test_golden_ijepa.py",
               "test_gpu_benchmark.py", "test_buckets.py", "test_bucket_lease.py", "test_bucket_runs.py",
               "test_lejepa_audio_video.py",
               "test_objective_vjepa.py", "test_models.py", "test_generative_cli.py", "test_online_probe.py",
               "test_training_cli.py", "test_adversarial_encode_probe.py", "test_adversarial_train.py",
               "test_training_loop.py", "test_objective_ijepa.py", "test_probe.py", "test_generative.py",
               "test_import_checkpoint.py", "test_masks.py")


def pytest_configure(config):
    import jax

    # This process's own compiles also skip LLVM's expensive passes (JAX's public flag; backend level 0
    # is in COMPILE_FASTER already): about a tenth less CPU in the heaviest in-process files
    # (benchmarks/NOTES.md, "Test compiles on public JAX"). The `jepa` subprocesses keep COMPILE_FASTER alone.
    jax.config.update("jax_disable_most_optimizations", True)
    # A test that starts a process (`jepa`, make, a held command), trains, or needs a module- or
    # session-scoped fixture that does (seconds to minutes each) carries this marker, or its file
    # `pytestmark = pytest.mark.slow`.
    config.addinivalue_line("markers", "slow: trains, runs `jepa` in a subprocess or runs make (`make check` skips these)")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
