"""Hostile-user cases for `jepa mask`, `jepa info`, `jepa completion`, usage errors and what reaches
stderr once JAX has started. Each case runs the real CLI (tests/adversarial.py) unless it
is a click usage error, which the cheaper in-process runner shows as well."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import numpy as np
import pytest

from adversarial import assert_one_error_line, expect_refusal, jepa_env, run_jepa, snapshot, start_held
from conftest import assert_user_error
from jepa_cli.cli.main import COMMANDS


@pytest.fixture(scope="module")
def mask_file(tmp_path_factory) -> Path:
    """A small valid mask file (6x6 grid, 4 samples), written once for the cases that damage a copy."""
    path = tmp_path_factory.mktemp("masks") / "m.zarr"
    result = run_jepa("mask", "--grid", "6x6", "--batch-size", "4", "--context-size", "8", "-o", path, "-q")
    assert result.returncode == 0, result.stderr
    return path


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# --- jepa mask: limits and option values -------------------------------------------------------------


@pytest.mark.slow
def test_mask_grid_over_the_patch_limit_is_refused_at_once(tmp_path):
    start = time.perf_counter()
    expect_refusal("mask", "--grid", "5000x5000", "--batch-size", "1", "-o", tmp_path / "m.zarr", guard=[tmp_path],
                   fragments=["--grid 5000x5000 has 25000000 patches", "limit of 8192"])
    assert time.perf_counter() - start < 60  # refused from the sizes alone, before any mask is drawn


# The bounds below need no process of their own: the in-process runner shows the same one line.
MASK_REFUSALS = {
    "frames-over-the-patch-limit": (["--strategy", "multiblock3d", "--frames", "100000", "-o", "{tmp}/m.zarr"],
                                    ["--frames 100000 --grid 14x14 has 19600000 patches"]),
    "batch-over-the-cell-limit": (["--grid", "14x14", "--batch-size", "1000000000", "-o", "{tmp}/m.zarr"],
                                  ["--batch-size 1000000000: must lie in 1..136956", "134217728 mask cells"]),
    "npred-over-the-block-limit": (["--npred", "1000"], ["--npred must lie in 1..64", "1000"]),
    "blocks-over-all-pairs": (["--strategy", "multiblock3d", "--npred", "60,10"],
                              ["--npred 60,10: at most 64 blocks", "got 70"]),
    "context-size-larger-than-the-grid": (["--grid", "14x14", "--context-size", "197", "-o", "{tmp}/m.zarr"],
                                          ["--context-size 197 must lie in 1..196", "--grid 14x14"]),
    "inverted-scale": (["--pred-scale", "0.3,0.2"], ["--pred-scale: inverted range 0.3,0.2"]),
    "negative-scale": (["--enc-scale=-0.5,1"], ["--enc-scale: values must lie in (0, 1], got -0.5,1"]),
    "ratio-above-one": (["--strategy", "random", "--ratio", "0.4,1.5"],
                        ["--ratio: values must lie in (0, 1], got 0.4,1.5"]),
    "aspect-beyond-any-grid": (["--aspect", "0.5,1e9"],
                               ["--aspect: values must lie in [1/8192, 8192], got 0.5,1e+09"]),
    "min-keep-above-the-context-block": (["--grid", "4x4", "--min-keep", "99"],
                                         ["--grid 4x4 cannot hold the context block", "--min-keep 99"]),
    "block-counts-not-integers": (["--strategy", "multiblock3d", "--npred", "a,b"],
                                  ["--npred: expected an integer, got 'a'"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("args, fragments", MASK_REFUSALS.values(), ids=MASK_REFUSALS.keys())
def test_mask_option_out_of_bounds_is_refused_writing_nothing(run_cli, tmp_path, args, fragments):
    before = snapshot([tmp_path])
    assert_user_error(run_cli("mask", *[a.format(tmp=tmp_path) for a in args]), *fragments)
    assert snapshot([tmp_path]) == before


@pytest.mark.slow
def test_mask_sigterm_while_writing_exits_143_and_leaves_nothing(tmp_path):
    """SIGTERM once the output's temporary directory holds its group metadata: exit 143, one line, nothing left."""
    folder = tmp_path / "out"
    folder.mkdir()
    process = start_held(tmp_path / "held", "jepa_cli.data.store:write_group", "after", "mask", "--grid", "6x6",
                         "--batch-size", "4", "--context-size", "8", "-o", folder / "m.zarr")
    assert any(f.is_file() for f in folder.rglob("*"))  # inside the write
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert_one_error_line(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), code=143,
                          fragments=["terminated (SIGTERM)"])
    assert list(folder.iterdir()) == []


# --- jepa info: things that are not what they seem --------------------------------------------------------


@pytest.mark.slow
def test_info_of_an_empty_directory_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    expect_refusal("info", tmp_path / "empty", guard=[tmp_path], fragments=[f"{tmp_path / 'empty'}: not a zarr v3 group"])


@pytest.mark.slow
def test_info_of_a_plain_file_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("hello\n")
    expect_refusal("info", tmp_path / "notes.txt", guard=[tmp_path], fragments=[f"{tmp_path / 'notes.txt'}: not a zarr"])


@pytest.mark.slow
def test_info_of_a_users_folder_is_refused(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.png").write_bytes(b"\x89PNG not really")
    expect_refusal("info", folder, guard=[tmp_path], fragments=[f"{folder}: not a zarr v3 group"])


@pytest.mark.slow
def test_info_of_a_corrupt_group_zarr_json_is_refused(tmp_path, mask_file):
    broken = _copy(mask_file, tmp_path / "m.zarr")
    (broken / "zarr.json").write_text('{"zarr_format": 3, "node_type": ')
    expect_refusal("info", broken, guard=[tmp_path], fragments=[str(broken)])


@pytest.mark.slow
def test_info_of_a_mask_file_with_a_truncated_chunk_names_the_array(tmp_path, mask_file):
    broken = _copy(mask_file, tmp_path / "m.zarr")
    chunk = next(p for p in sorted((broken / "context").rglob("*")) if p.is_file() and p.name != "zarr.json")
    chunk.write_bytes(chunk.read_bytes()[:5])
    expect_refusal("info", broken, guard=[tmp_path], fragments=[str(broken / "context")])


@pytest.mark.slow
def test_info_of_a_mask_file_with_damaged_attributes_is_refused(tmp_path, mask_file):
    broken = _copy(mask_file, tmp_path / "m.zarr")
    meta = json.loads((broken / "zarr.json").read_text())
    meta["attributes"]["grid"] = "6x6"
    (broken / "zarr.json").write_text(json.dumps(meta))
    expect_refusal("info", broken, guard=[tmp_path],
                   fragments=[f"{broken / 'zarr.json'}: damaged mask file attributes (grid '6x6', frames None)"])


@pytest.mark.slow
def test_info_of_a_mask_file_whose_arrays_do_not_fit_its_grid_is_refused(tmp_path, mask_file):
    broken = _copy(mask_file, tmp_path / "m.zarr")
    meta = json.loads((broken / "zarr.json").read_text())
    meta["attributes"]["grid"] = [7, 7]
    (broken / "zarr.json").write_text(json.dumps(meta))
    expect_refusal("info", broken, guard=[tmp_path],
                   fragments=[f"{broken}: context bool[4, 36] and targets bool[4, 4, 36] do not fit a grid of 49"])


# --- stdout and error lines are valid UTF-8 ----------------------------------------------------------------


@pytest.mark.slow
def test_info_json_escapes_lone_surrogates_in_attributes(tmp_path):
    from jepa_cli.data import store

    dataset = tmp_path / "d.zarr"
    store.write_group(dataset, {"jepa_kind": "dataset", "class_names": ["a"], "source": "caf\udce9"})
    store.write_array(dataset / "inputs", np.zeros((2, 1, 2, 2), np.uint8))
    result = run_jepa("info", dataset, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.decode("utf-8"))["attributes"]["source"] == "caf\\xe9"


@pytest.mark.slow
def test_an_error_naming_a_non_utf8_path_is_valid_utf8(tmp_path):
    missing = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9.zarr"))
    result = run_jepa("info", missing)
    line = assert_one_error_line(result, 2)
    assert line == f"jepa: error: {tmp_path}/caf\\xe9.zarr: no such file or directory"
    result.stderr.decode("utf-8")  # strict: no lone surrogate escaped into the bytes


# --- one error line after JAX has started, for every command ---------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("args, fragment", [
    (["mask", "--grid", "4x4", "--min-keep", "99"], "--min-keep 99"),
    (["probe", "linear", "nowhere-train.zarr", "nowhere-test.zarr"], "nowhere-train.zarr"),
    (["encode-latents", "not-a-run", "nowhere.zarr", "-o", "out.zarr"], "nowhere.zarr"),
    (["ema-inspect", "not-a-run"], "not-a-run"),
])
def test_an_error_after_jax_starts_is_one_line(tmp_path, args, fragment):
    (tmp_path / "not-a-run").mkdir()
    expect_refusal(*args, cwd=tmp_path, guard=[tmp_path], fragments=[fragment])


GPU_FALLBACK = """
import sys
import jax._src.hardware_utils as hardware
hardware.has_visible_nvidia_gpu = lambda: True  # as on a GPU machine whose jaxlib has no CUDA
from jepa_cli.cli.main import main
sys.argv = ["jepa", *sys.argv[1:]]
main()
"""


def _gpu_fallback(*args: str) -> subprocess.CompletedProcess:
    env = jepa_env()
    env.pop("JAX_PLATFORMS", None)  # JAX looks for the GPU, as a user's shell would let it
    return subprocess.run([sys.executable, "-c", GPU_FALLBACK, *args], env=env, capture_output=True, timeout=300)


@pytest.mark.slow
def test_jax_warnings_never_reach_stderr_without_verbose():
    result = _gpu_fallback("mask", "--grid", "6x6", "--batch-size", "2", "--context-size", "8", "--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == b""


@pytest.mark.slow
def test_verbose_lets_jax_warnings_through():
    result = _gpu_fallback("mask", "--grid", "6x6", "--batch-size", "2", "--context-size", "8", "--json", "-v")
    assert b"WARNING jax._src.xla_bridge: An NVIDIA GPU may be present" in result.stderr


# --- click usage errors: one line for every command (in-process) ------------------------------------------


def _command(name: str) -> click.Command:
    return importlib.import_module(COMMANDS[name][0]).command


def _first_choice(name: str) -> click.Parameter | None:
    return next((p for p in _command(name).params if isinstance(p.type, click.Choice)), None)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_an_unknown_option_is_one_line(run_cli, name):
    assert_user_error(run_cli(name, "--no-such-option"), "No such option", "--no-such-option")


@pytest.mark.parametrize("name", [n for n in sorted(COMMANDS)
                                  if any(isinstance(p, click.Argument) and p.required for p in _command(n).params)])
def test_a_missing_argument_is_one_line(run_cli, name):
    assert_user_error(run_cli(name), "Missing argument")


@pytest.mark.parametrize("name", [n for n in sorted(COMMANDS) if _first_choice(n) is not None])
def test_a_bad_choice_is_one_line(run_cli, name):
    param = _first_choice(name)
    args = ["no-such-choice"] if isinstance(param, click.Argument) else [param.opts[0], "no-such-choice"]
    assert_user_error(run_cli(name, *args), "'no-such-choice'")  # is not one of ..., or: must be one of ..., got


def test_completion_for_an_unknown_shell_is_one_line(run_cli):
    assert_user_error(run_cli("completion", "tcsh"), "'tcsh' is not one of 'bash', 'zsh', 'fish'")
