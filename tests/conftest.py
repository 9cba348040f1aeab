"""Shared test helpers. Tests run JAX on the CPU; 8 simulated devices let sharding tests run on CPU."""

import contextlib
import functools
import inspect
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
# devices, this one included, keep none, as `jepa` itself does (cli/main.py, compilation_cache_dir):
# a step whose all-reduces were loaded from the cache can deadlock.
# The price is the compiles one test repeats of another's (benchmarks/NOTES.md, "The test suite").
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
               "test_gpu_benchmark.py",
               "test_objective_vjepa.py", "test_models.py", "test_generative_cli.py", "test_online_probe.py",
               "test_training_cli.py", "test_adversarial_encode_probe.py", "test_adversarial_train.py",
               "test_training_loop.py", "test_objective_ijepa.py", "test_probe.py", "test_generative.py",
               "test_import_checkpoint.py", "test_masks.py")


# Whole files of the slow tier: trainings joined by jax.distributed, the quickstart through make, the GPU
# benchmark's CPU run.
SLOW_FILES = ("test_multiprocess.py", "test_recipes_make.py", "test_gpu_benchmark.py")
# Source text that starts another process: each `jepa` subprocess pays the JAX import and its own compiles.
STARTS_A_PROCESS = ("run_jepa(", "expect_refusal(", "start_held(", "subprocess.", "Popen(")


@functools.cache  # collection asks for the same functions' text thousands of times
def _source(function) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


@functools.cache
def _process_starters(module) -> tuple[str, ...]:
    """STARTS_A_PROCESS and the calls of `module`'s own functions that start one (`_gpu_fallback(`)."""
    helpers = [f"{name}(" for name, value in vars(module).items()
               if inspect.isfunction(value) and value.__module__ == module.__name__ and not name.startswith("test_")
               and any(marker in _source(value) for marker in STARTS_A_PROCESS)]
    return STARTS_A_PROCESS + tuple(helpers)


def is_slow(item: pytest.Item) -> bool:
    """The slow tier (`-m slow`): a test in SLOW_FILES, one that starts a process (itself or through a
    function of its file), or one that needs a module- or session-scoped fixture of its own file (such
    fixtures train or run the CLI once for the file, which costs seconds to minutes). Fixtures of this
    conftest are cheap and do not count."""
    if item.path.name in SLOW_FILES or item.get_closest_marker("slow"):
        return True
    starters = _process_starters(item.module) if getattr(item, "module", None) else STARTS_A_PROCESS
    if any(marker in _source(getattr(item, "function", None)) for marker in starters):
        return True
    fixture_info = getattr(item, "_fixtureinfo", None)
    for definitions in (fixture_info.name2fixturedefs.values() if fixture_info else ()):
        for definition in definitions:
            if Path(inspect.getfile(definition.func)).name == "conftest.py":
                continue
            if definition.scope in ("module", "session") or any(
                    marker in _source(definition.func) for marker in starters):
                return True
    return False


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: trains, runs `jepa` in a subprocess or runs make (`make check` skips these)")


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        if is_slow(item):
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def _reuse_identical_compiles() -> None:
    """Hands a program that this process has compiled before its earlier executable instead of
    compiling it again. Tests build their models and steps afresh, so JAX traces them again and, with
    no persistent cache in this process (the warm-cache deadlock above), compiles the same programs
    again. The memo holds live executables, never deserialised ones: the same objects a jitted
    function reuses on its second call. Keyed by the module's text without its source locations (two
    traces of one program differ only there: the calling test's lines), its devices and its compile
    options; a program with host callbacks (bound to Python objects) always compiles."""
    import hashlib

    from jax._src import compiler

    compile_and_load = getattr(compiler, "backend_compile_and_load", None)
    if compile_and_load is None:  # a JAX without this private entry point: every program compiles, as before
        return
    compiled: dict[bytes, object] = {}

    def reuse(backend, module, executable_devices, options, host_callbacks):
        if host_callbacks:
            return compile_and_load(backend, module, executable_devices, options, host_callbacks)
        key = hashlib.sha256(module.operation.get_asm(enable_debug_info=False).encode())
        key.update(repr([device.id for device in executable_devices]).encode())
        key.update(options.SerializeAsString())
        digest = key.digest()
        if digest not in compiled:
            compiled[digest] = compile_and_load(backend, module, executable_devices, options, host_callbacks)
        return compiled[digest]

    compiler.backend_compile_and_load = reuse


_reuse_identical_compiles()
