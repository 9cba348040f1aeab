"""`jepa runs DIR...`: one table of runs from their run.json and metrics.jsonl (docs/formats.md, "Runs and
checkpoints")."""

import json
from pathlib import Path

import pytest

from conftest import assert_user_error

pytestmark = pytest.mark.slow


def fake_run(path: Path, lr: float, depth: int, metrics: list[dict], status: str = "finished") -> Path:
    """A run folder as `jepa train` leaves it, without checkpoints: run.json and metrics.jsonl."""
    path.mkdir(parents=True)
    config = {"objective": "ijepa", "data": "d.zarr", "out": str(path), "steps": 4, "lr": lr, "seed": 0,
              "betas": [0.9, 0.999], "objective_config": {"model": {"depth": depth, "width": 64}, "npred": 4}}
    record = {"jepa_kind": "run", "config": config, "lengths": {"steps": 4, "ipe": 2, "t_max": 4, "warmup_steps": 1},
              "status": status}
    (path / "run.json").write_text(json.dumps(record))
    (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in metrics))
    return path


def two_runs(root: Path) -> tuple[Path, Path]:
    a = fake_run(root / "a" / "run", 1e-3, 2, [{"step": 0, "knn_top1": 0.1, "knn_top5": 0.5},
                                               {"step": 1, "loss": 0.9}, {"step": 2, "loss": 0.7,
                                                                           "knn_top1": 0.25, "knn_top5": 0.75},
                                               {"step": 3, "loss": None}])
    b = fake_run(root / "b" / "run", 1e-3, 4, [{"step": 1, "loss": 0.8}, {"step": 2, "loss": 0.6}],
                 status="interrupted")
    return a, b


def test_runs_lists_every_run_below_a_folder_with_the_keys_that_differ(run_cli, tmp_path):
    two_runs(tmp_path / "runs")
    result = run_cli("runs", tmp_path / "runs", "--json")
    assert result.exit_code == 0, result.stderr
    table = json.loads(result.stdout)
    assert table["differing_keys"] == ["ijepa.model.depth"]  # lr, seed, betas, width: the same; out: left out
    a, b = table["runs"]
    assert a["run"].endswith("a/run") and a["config"] == {"ijepa.model.depth": 2}
    assert (a["step"], a["total_steps"], a["status"]) == (3, 4, "finished")
    assert a["final_loss"] == 0.7  # the last finite loss: step 3 logged null
    assert a["probe"] == {"step": 2, "knn_top1": 0.25, "knn_top5": 0.75}
    assert (b["step"], b["final_loss"], b["probe"], b["status"]) == (2, 0.6, None, "interrupted")


def test_runs_in_folders_starting_with_a_dot_are_not_listed(run_cli, tmp_path):
    two_runs(tmp_path / "runs")
    fake_run(tmp_path / "runs" / ".trash" / "old", 1e-3, 8, [{"step": 1, "loss": 0.5}])
    result = run_cli("runs", tmp_path / "runs", "--json")
    assert result.exit_code == 0, result.stderr
    assert [Path(row["run"]).parent.name for row in json.loads(result.stdout)["runs"]] == ["a", "b"]


def test_a_run_named_directly_and_through_its_folder_is_listed_once(run_cli, tmp_path):
    a, _ = two_runs(tmp_path / "runs")
    result = run_cli("runs", a, tmp_path / "runs", "--json")
    assert [Path(row["run"]).parent.name for row in json.loads(result.stdout)["runs"]] == ["a", "b"]


def test_one_run_has_no_differing_keys(run_cli, tmp_path):
    a, _ = two_runs(tmp_path / "runs")
    assert json.loads(run_cli("runs", a, "--json").stdout)["differing_keys"] == []


def test_the_table_names_each_run_by_the_shortest_distinct_end_of_its_path(run_cli, tmp_path):
    two_runs(tmp_path / "runs")
    result = run_cli("runs", tmp_path / "runs")
    assert result.exit_code == 0, result.stderr
    header, first, second = result.stdout.strip().splitlines()
    assert header.split() == ["run", "objective", "ijepa.model.depth", "step", "status", "loss", "probe_step",
                              "knn_top1", "knn_top5"]
    assert first.split() == ["a/run", "ijepa", "2", "3/4", "finished", "0.7", "2", "0.25", "0.75"]
    assert second.split() == ["b/run", "ijepa", "4", "2/4", "interrupted", "0.6", "-", "-", "-"]


def test_a_folder_without_runs_is_one_line(run_cli, tmp_path):
    (tmp_path / "empty").mkdir()
    assert_user_error(run_cli("runs", tmp_path / "empty"), "empty: holds no training run")


def test_a_damaged_run_json_is_one_line_naming_it(run_cli, tmp_path):
    a, _ = two_runs(tmp_path / "runs")
    (a / "run.json").write_text("{")
    assert_user_error(run_cli("runs", tmp_path / "runs"), "run.json: damaged")
