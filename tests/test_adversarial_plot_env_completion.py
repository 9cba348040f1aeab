"""Hostile input to `jepa plot`, `jepa env`, `jepa info` and shell completion: damaged runs and
datasets, absurd requests, concurrent writers, an interrupted write, a backend that cannot start,
names that are not UTF-8."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from adversarial import assert_one_error_line, expect_refusal, jepa_env, run_jepa, start_held
from conftest import assert_user_error

pytestmark = pytest.mark.slow


@pytest.fixture
def run(tmp_path) -> Path:
    """A run directory as `jepa train` leaves it, with 50 logged rows (no checkpoint is needed to plot)."""
    path = tmp_path / "run"
    path.mkdir()
    (path / "run.json").write_text(json.dumps({"jepa_kind": "run", "config": {"objective": "ijepa"},
                                               "lengths": {"steps": 50}, "status": "finished"}))
    rows = [{"step": s, "loss": 1.0 / s, "lr": 1e-3, "weight_decay": 0.04, "ema_momentum": 0.996,
             "repr_std": 0.1, "repr_cov_offdiag": 0.01} for s in range(1, 51)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_plot_of_a_run_whose_metrics_file_is_truncated_to_half_a_line_is_refused(run, tmp_path):
    (run / "metrics.jsonl").write_text('{"step": 1, "lo')
    expect_refusal("plot", run, "-o", tmp_path / "c.png", guard=[tmp_path],
                   fragments=[f"{run}: no metrics logged yet"])


def test_plot_of_a_damaged_run_json_is_refused(run, tmp_path):
    (run / "run.json").write_bytes(b"\x00\xff{")
    expect_refusal("plot", run, "-o", tmp_path / "c.png", guard=[tmp_path], fragments=["run.json: damaged"])


def test_plot_of_an_absurd_number_of_metrics_is_refused_before_drawing(run, tmp_path):
    metrics = ",".join(f"m{i}" for i in range(10_000))
    expect_refusal("plot", run, "-o", tmp_path / "c.png", "--metrics", metrics, guard=[tmp_path],
                   fragments=["--metrics names 10000 metrics; at most 24 panels fit one picture"])


def test_plot_over_a_file_that_is_not_a_png_is_refused_even_with_force(run, tmp_path):
    notes = tmp_path / "notes.png"
    notes.write_text("my notes\n")
    expect_refusal("plot", run, "-o", notes, "--force", guard=[tmp_path], fragments=["not a PNG picture"])


def test_of_two_concurrent_plots_to_one_new_png_exactly_one_writes_it(run, tmp_path):
    png = tmp_path / "c.png"
    procs = [subprocess.Popen([sys.executable, "-m", "jepa_cli", "plot", str(run), "-o", str(png)], env=jepa_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    results = [subprocess.CompletedProcess(p.args, p.wait(timeout=120), *p.communicate()) for p in procs]
    # the second finds the picture there when it starts or when it commits: never a second write, never a torn file
    assert sorted(r.returncode for r in results) == [0, 2], [r.stderr for r in results]
    assert_one_error_line(next(r for r in results if r.returncode == 2), 2, ["already exists"])
    assert png.read_bytes().startswith(b"\x89PNG")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.png", "run"]  # no partial left behind


@pytest.mark.parametrize("target, when, error", [
    ("matplotlib.figure:Figure.savefig", "before", "terminated (SIGTERM)"),
    ("jepa_cli.data.atomic:write_file", "after", "terminated (SIGTERM) after {png} was written in full"),
])
def test_plot_interrupted_by_sigterm_leaves_a_whole_png_or_none_and_says_which(run, tmp_path, target, when, error):
    png, marker = tmp_path / "c.png", tmp_path / "held"
    process = start_held(marker, target, when, "plot", run, "-o", png)  # while drawing, or once the PNG is in place
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    line = assert_one_error_line(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), 143)
    assert line == "jepa: error: " + error.format(png=png)
    if when == "before":
        assert not png.exists()
    else:
        assert png.read_bytes().startswith(b"\x89PNG") and png.read_bytes().endswith(b"IEND\xaeB`\x82")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["run", "held", *(["c.png"] if png.exists() else [])])


def test_env_with_a_backend_this_machine_cannot_start_is_one_line():
    result = run_jepa("env", env={"JAX_PLATFORMS": "tpu"})
    assert_one_error_line(result, 2, ["JAX cannot start its backend"])


def test_completion_skips_a_folder_whose_name_is_not_utf8(tmp_path):
    (tmp_path / os.fsdecode(b"caf\xe9")).mkdir()
    (tmp_path / "runs").mkdir()
    env = {"COMP_WORDS": "jepa ema-inspect ", "COMP_CWORD": "2", "_JEPA_COMPLETE": "bash_complete"}
    result = run_jepa(cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().splitlines() == ["plain,runs/"]


def test_info_json_of_a_dataset_whose_attributes_hold_nan_prints_null(tmp_path, run_cli):
    from jepa_cli.data import store

    data = tmp_path / "d.zarr"
    store.write_group(data, store.base_attributes("dataset", modality="latent", layout="ND", class_names=[],
                                                  sampling={"eta": float("nan"), "scale": [float("inf"), 1.5]}))
    store.write_array(data / "inputs", np.zeros((2, 3), np.float32))
    r = run_cli("info", data, "--json")
    assert r.exit_code == 0, r.stderr

    def refuse(constant):
        raise AssertionError(f"not JSON: {constant}")

    described = json.loads(r.stdout, parse_constant=refuse)
    assert described["attributes"]["sampling"] == {"eta": None, "scale": [None, 1.5]}


def test_plot_of_a_flow_run_by_default_draws_the_default_metrics_it_logged(tmp_path, run_cli):
    flow = tmp_path / "flow"
    flow.mkdir()
    (flow / "run.json").write_text(json.dumps({"jepa_kind": "run", "config": {"objective": "flow"},
                                               "lengths": {"steps": 3}, "status": "finished"}))
    rows = [{"step": s, "loss": 1.0 / s, "lr": 1e-3, "weight_decay": 0.0, "ema_momentum": 0.75, "t_mean": 0.5}
            for s in (1, 2, 3)]
    (flow / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = run_cli("plot", flow, "-o", tmp_path / "c.png", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["metrics"] == ["loss", "lr", "weight_decay", "ema_momentum"]


def test_env_reports_a_compilation_cache_path_that_is_a_file_as_off(tmp_path):
    cache = tmp_path / "cache"
    cache.write_text("not a folder\n")
    result = run_jepa("env", "--json", env={"JAX_COMPILATION_CACHE_DIR": str(cache)})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["compilation_cache"], report["compilation_cache_off"]) == (None, f"{cache} is not a directory")


def test_plot_into_the_run_it_reads_is_refused(run, run_cli):
    png = run / "curves.png"
    assert_user_error(run_cli("plot", run, "-o", png), f"{png}: the output lies inside the input {run}")
    assert not png.exists()


def _labelled(path, labels, class_names):
    from jepa_cli.data import store

    store.write_group(path, store.base_attributes("dataset", modality="image", layout="NHWC", class_names=class_names))
    store.write_array(path / "inputs", np.zeros((len(labels), 4, 4, 1), np.uint8))
    store.write_array(path / "labels", labels)
    return path


@pytest.mark.parametrize("labels, found", [(np.array([-1, 0, 0], np.int32), "not class indices (int32 >= 0), "
                                                                            "found label -1"),
                                           (np.array([0.5, 1.0, 0.0], np.float32), "not class indices (int32 >= 0), "
                                                                                   "found float32"),
                                           (np.array([0, 2**31 - 1], np.int32), "label 2147483647 but 1 class_names")])
def test_info_of_a_dataset_whose_labels_are_not_class_indices_is_one_line(tmp_path, run_cli, labels, found):
    data = _labelled(tmp_path / "d.zarr", labels, ["a"])
    assert_user_error(run_cli("info", data), f"{data / 'labels'}: {found}")


def test_info_histogram_of_unnamed_labels_counts_the_labels_present(tmp_path, run_cli):
    data = _labelled(tmp_path / "d.zarr", np.array([0, 2**31 - 1, 0], np.int32), [])
    r = run_cli("info", data, "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["label_histogram"] == {"0": 2, "2147483647": 1}


def _fake_run(path: Path) -> Path:
    """A run directory holding three logged rows: enough to plot."""
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"jepa_kind": "run", "config": {"objective": "ijepa"},
                                               "lengths": {"steps": 3}, "status": "finished"}))
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in (1, 2, 3)))
    return path


def test_plot_labels_runs_of_one_name_by_the_shortest_distinct_end_of_their_paths(tmp_path, run_cli):
    runs = [_fake_run(tmp_path / "a" / "run"), _fake_run(tmp_path / "b" / "run"), _fake_run(tmp_path / "c" / "solo")]
    r = run_cli("plot", *runs, "-o", tmp_path / "c.png", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["labels"] == ["a/run", "b/run", "solo"]


def test_plot_label_names_each_run_in_order(tmp_path, run_cli):
    runs = [_fake_run(tmp_path / "a" / "run"), _fake_run(tmp_path / "b" / "run")]
    r = run_cli("plot", *runs, "-o", tmp_path / "c.png", "--label", "baseline", "--label", "wider", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["labels"] == ["baseline", "wider"]


def test_plot_with_a_label_count_other_than_the_run_count_is_refused(tmp_path, run_cli):
    runs = [_fake_run(tmp_path / "a" / "run"), _fake_run(tmp_path / "b" / "run")]
    assert_user_error(run_cli("plot", *runs, "-o", tmp_path / "c.png", "--label", "baseline"),
                      "--label given 1 time(s) for 2 run(s)")
    assert not (tmp_path / "c.png").exists()
