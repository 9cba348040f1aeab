"""Hostile options and hostile moments (tests/adversarial.py): absurd S5 sizes, a process out of memory,
an internal error, a guidance interval that guides nothing, SIGTERM while `jepa sample` samples or
after it wrote its output, and plot labels that matplotlib would misread."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from adversarial import assert_one_error_line, expect_refusal, jepa_env, run_jepa, start_held
from test_adversarial_plot_env_completion import run  # noqa: F401 - a fixture: a run with logged rows

from jepa_cli.data import store

pytestmark = pytest.mark.slow

FLOW_RECIPE = """objective = "flow"
mesh = "data=1"
batch_size = 8
warmup_steps = 0
[flow]
width = 16
depth = 1
heads = 2
patch_size = 4
"""

# `jepa ARGS` with one function replaced by one that raises the exception `raised` (Python source)
FAILING = """
import importlib, sys
module, attribute, raised = sys.argv[1:4]
owner_path, _, name = attribute.rpartition(".")
owner = importlib.import_module(module)
for part in filter(None, owner_path.split(".")):
    owner = getattr(owner, part)
def failing(*args, **kwargs):
    raise eval(raised)
setattr(owner, name, failing)
sys.argv[1:] = sys.argv[4:]
from jepa_cli.cli.main import main
main()
"""


def _run_failing(target: str, raised: str, *args) -> subprocess.CompletedProcess:
    module, attribute = target.split(":")
    return subprocess.run([sys.executable, "-c", FAILING, module, attribute, raised, *map(str, args)],
                          env=jepa_env(), capture_output=True, timeout=120)


def _images(path: Path, n: int = 24, size: int = 8) -> Path:
    rng = np.random.default_rng(0)
    store.write_group(path, store.base_attributes("dataset", modality="image", layout="NHWC",
                                                  class_names=["a", "b", "c"]))
    store.write_array(path / "inputs", rng.integers(0, 256, (n, size, size, 1), dtype=np.uint8))
    store.write_array(path / "labels", (np.arange(n) % 3).astype(np.int32))
    return path


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return _images(tmp_path_factory.mktemp("images") / "d.zarr")


@pytest.fixture(scope="module")
def flow_run(tmp_path_factory, images) -> Path:
    """A class-conditional flow run of one update (a 1-block DiT of width 16 on 8x8 images)."""
    d = tmp_path_factory.mktemp("flow")
    (d / "flow.toml").write_text(FLOW_RECIPE)
    result = run_jepa("train", "--config", d / "flow.toml", "--data", images, "-o", d / "run", "--steps", "1",
                      "-q", "--json", timeout=240)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    return d / "run"


# ---- model sizes -------------------------------------------------------------------------------------

def test_an_ssm_state_too_large_to_initialise_is_refused_by_print_config(images, tmp_path):
    expect_refusal("train", "--data", images, "--steps", "1", "--batch-size", "8", "--patch-size", "4", "--mixer", "s5",
                   "--ssm-state", "200000", "--print-config", guard=[tmp_path], timeout=120,
                   fragments=["ssm_state must be at most 2048", "P x P matrix", "got 200000"])


def test_an_ssm_step_range_beyond_float32_is_refused_by_print_config(images, tmp_path):
    expect_refusal("train", "--data", images, "--steps", "1", "--batch-size", "8", "--patch-size", "4", "--mixer", "s5",
                   "--ssm-step", "1e300,1e300", "--print-config", guard=[tmp_path], timeout=120,
                   fragments=["ssm_step must lie within 1e-06..100", "float32", "got 1e+300,1e+300"])


# ---- the last line of defence ------------------------------------------------------------------------

def test_running_out_of_memory_is_one_line_saying_so(images):
    line = assert_one_error_line(_run_failing("jepa_cli.data.describe:describe", "MemoryError()", "info", images),
                                 2, ["jepa info ran out of memory", "--batch-size"])
    assert "MemoryError" not in line


def test_a_thread_the_system_cannot_start_is_reported_as_running_out_of_memory(images):
    result = _run_failing("jepa_cli.data.describe:describe", "RuntimeError(\"can't start new thread\")", "info",
                          images)
    assert_one_error_line(result, 2, ["jepa info ran out of memory"])


def test_an_internal_error_names_the_command_and_jepa_debug_not_the_exception_class(images):
    line = assert_one_error_line(_run_failing("jepa_cli.data.describe:describe", "ValueError('boom')", "info",
                                              images), 1)
    assert line == "jepa: error: internal error in jepa info: boom (rerun with JEPA_DEBUG=1 for the traceback)"


# ---- guidance ----------------------------------------------------------------------------------------

def test_a_guidance_interval_holding_no_level_of_the_sampler_is_refused(flow_run, tmp_path):
    # 4 flow steps evaluate t = 1, 0.75, 0.5, 0.25: (0.51, 0.52] holds none, so scale 3 would guide nothing
    expect_refusal("sample", flow_run, "-n", "4", "-o", tmp_path / "s.zarr", "--steps", "4", "--mesh", "data=1",
                   "--guidance-scale", "3", "--guidance-interval", "0.51,0.52", guard=[tmp_path, flow_run],
                   timeout=120, fragments=["--guidance-interval 0.51,0.52", "--steps 4", "0.75 and 0.5"])


# ---- signals -----------------------------------------------------------------------------------------

def test_sigterm_while_sample_shuts_down_after_writing_says_the_output_is_whole(flow_run, tmp_path):
    out = tmp_path / "s.zarr"
    # held where the interpreter, at exit, joins the Python threads: the output is in place, stdout written
    process = start_held(tmp_path / "marker", "threading:_shutdown", "before", "sample", flow_run, "-n", "4",
                         "-o", out, "--steps", "2", "--mesh", "data=1", "-q", "--json")
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=60)
    assert_one_error_line(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), 143,
                          [f"terminated (SIGTERM) after {out} was written in full"])
    assert json.loads(stdout)["num_samples"] == 4


@pytest.mark.slow  # a regression guard: three samplers stopped at random moments
def test_sigterm_mid_sampling_always_exits_143_with_its_line(flow_run, tmp_path):
    rng = random.Random(0)
    for attempt in range(3):
        out = tmp_path / f"s{attempt}.zarr"
        process = subprocess.Popen([sys.executable, "-m", "jepa_cli", "sample", str(flow_run), "-n", "100000",
                                    "-o", str(out), "--steps", "4", "--mesh", "data=1", "-q"],
                                   env=jepa_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while not any(tmp_path.glob(f".{out.name}.partial*")):  # sampling has begun
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 1.0))
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=60)
        assert_one_error_line(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), 143,
                              ["terminated (SIGTERM)"])


# ---- plot labels -------------------------------------------------------------------------------------

def test_a_label_with_unbalanced_mathtext_dollars_is_drawn_as_written(run, tmp_path):
    pytest.importorskip("matplotlib")
    result = run_jepa("plot", run, "-o", tmp_path / "c.png", "--label", r"$\frac{$", timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    assert (tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")


def test_a_label_starting_with_an_underscore_is_shown_in_the_legend(run, tmp_path):
    pytest.importorskip("matplotlib")
    pictures = []
    for label in ("_x", "_y"):
        result = run_jepa("plot", run, "-o", tmp_path / f"{label}.png", "--label", label, timeout=120)
        assert result.returncode == 0, result.stderr.decode()
        pictures.append((tmp_path / f"{label}.png").read_bytes())
    assert pictures[0] != pictures[1]  # a legend left out would draw both the same
