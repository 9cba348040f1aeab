"""Daily use: what a user's own strings look like in the tables, `jepa runs` over many objectives, a
short run's EMA, the ingest summary."""

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import assert_user_error

WIDE = {"COLUMNS": "1000"}  # no table cell wrapped: each value is read on one line

# Strings that rich would read as markup: a style tag pair, an unknown tag, a character class.
CLASS_NAMES = ("[bold]x[/bold]", "[brackets]")
GROUP_REGEX = "_([a-z]+)_"


@pytest.fixture(scope="module")
def bracketed_dataset(tmp_path_factory) -> Path:
    """A dataset ingested from the folder `[brackets] data` into `[bold]set[/bold].zarr` (under a folder
    `[bold]set[`), classes named by CLASS_NAMES from a labels CSV, a test split of whole groups by
    GROUP_REGEX."""
    from click.testing import CliRunner

    from jepa_cli.cli.main import cli

    root = tmp_path_factory.mktemp("markup")
    source = root / "[brackets] data"
    source.mkdir()
    rows = []
    for c, name in enumerate(CLASS_NAMES):
        for group in ("aa", "bb", "cc"):
            for i in range(2):
                path = source / f"img_{group}_{c}{i}.png"
                Image.fromarray(np.full((4, 4), 40 * c + i, np.uint8)).save(path)
                rows.append(f"{path.name},{name}\n")
    (root / "labels.csv").write_text("path,label\n" + "".join(rows))
    (root / "[bold]set[").mkdir()
    out = root / "[bold]set[/bold].zarr"
    result = CliRunner().invoke(cli, ["ingest", str(source), str(out), "--labels", str(root / "labels.csv"),
                                      "--group-regex", GROUP_REGEX, "--split", "train"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.slow
def test_info_shows_class_names_paths_and_regexes_literally(run_cli, bracketed_dataset):
    result = run_cli("info", bracketed_dataset, env=WIDE)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"dataset: {bracketed_dataset}"  # the table's title
    assert any(line.split() == ["path", str(bracketed_dataset)] for line in lines)
    assert f'"group_regex": "{GROUP_REGEX}"' in result.stdout
    assert f'"source": "{bracketed_dataset.parent.parent / "[brackets] data"}"' in result.stdout
    assert f"class_names    {list(CLASS_NAMES)}" in result.stdout
    histogram = [line.strip("│ ").split()[0] for line in lines if line.startswith("│")]
    assert histogram == list(CLASS_NAMES)


@pytest.mark.slow
def test_mask_shows_its_output_path_literally(run_cli, bracketed_dataset, tmp_path):
    (tmp_path / "[bold]m[").mkdir()
    out = tmp_path / "[bold]m[/bold] [brackets].zarr"
    result = run_cli("mask", "--grid", "8x8", "--batch-size", "2", "-o", out, env=WIDE)
    assert result.exit_code == 0, result.stderr
    assert [line.split(None, 1) for line in result.stdout.splitlines()][-1] == ["output", str(out)]


# `jepa runs`: one table per objective, --objective, --columns, the probe results of files.

def fake_run(path: Path, objective: str, options: dict, lr: float = 1e-3, metrics: tuple = ()) -> Path:
    """A run folder as `jepa train` leaves it, without checkpoints: run.json and metrics.jsonl."""
    path.mkdir(parents=True)
    config = {"objective": objective, "data": "d.zarr", "out": str(path), "steps": 4, "lr": lr,
              "objective_config": options}
    (path / "run.json").write_text(json.dumps({"jepa_kind": "run", "config": config, "lengths": {"steps": 4},
                                               "status": "finished"}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in metrics))
    return path


def three_objectives(root: Path) -> None:
    """ijepa a, b (depth 2, 4), vjepa c, d (frames 8, 16) and flow e: every objective's options are its own."""
    fake_run(root / "a", "ijepa", {"depth": 2, "npred": 4}, metrics=[{"step": 4, "loss": 0.5}])
    fake_run(root / "b", "ijepa", {"depth": 4, "npred": 4})
    fake_run(root / "c", "vjepa", {"frames": 8, "tubelet": 2}, lr=2e-3)
    fake_run(root / "d", "vjepa", {"frames": 16, "tubelet": 2}, lr=2e-3)
    fake_run(root / "e", "flow", {"sigma": 0.1})


@pytest.mark.slow
def test_runs_compares_the_options_of_each_objective_among_its_own_runs(run_cli, tmp_path):
    three_objectives(tmp_path)
    table = json.loads(run_cli("runs", tmp_path, "--json").stdout)
    assert table["objectives"] == {"ijepa": ["ijepa.depth"], "vjepa": ["vjepa.frames"], "flow": []}
    assert table["differing_keys"] == ["ijepa.depth", "vjepa.frames"]  # lr differs only across objectives
    assert [row["config"] for row in table["runs"]] == [{"ijepa.depth": 2}, {"ijepa.depth": 4}, {"vjepa.frames": 8},
                                                        {"vjepa.frames": 16}, {}]


@pytest.mark.slow
def test_runs_of_several_objectives_print_one_table_each_under_its_name(run_cli, tmp_path):
    three_objectives(tmp_path)
    result = run_cli("runs", tmp_path)
    assert result.exit_code == 0, result.stderr
    tables = [block.splitlines() for block in result.stdout.strip().split("\n\n")]
    assert [(lines[0], lines[1].split()) for lines in tables] == [
        ("ijepa: 2 run(s)", ["run", "objective", "ijepa.depth", "step", "status", "loss"]),
        ("vjepa: 2 run(s)", ["run", "objective", "vjepa.frames", "step", "status", "loss"]),
        ("flow: 1 run(s)", ["run", "objective", "step", "status", "loss"])]
    assert tables[0][2].split() == ["a", "ijepa", "2", "4/4", "finished", "0.5"]


@pytest.mark.slow
def test_runs_objective_keeps_the_runs_of_that_objective(run_cli, tmp_path):
    three_objectives(tmp_path)
    table = json.loads(run_cli("runs", tmp_path, "--objective", "vjepa", "--json").stdout)
    assert [Path(row["run"]).name for row in table["runs"]] == ["c", "d"]


@pytest.mark.slow
def test_runs_objective_that_no_run_has_is_one_line_naming_theirs(run_cli, tmp_path):
    three_objectives(tmp_path)
    assert_user_error(run_cli("runs", tmp_path, "--objective", "dino"), "--objective dino", "flow, ijepa, vjepa")


@pytest.mark.slow
def test_runs_columns_choose_the_table_columns(run_cli, tmp_path):
    three_objectives(tmp_path)
    result = run_cli("runs", tmp_path / "a", tmp_path / "c", "--columns", "lr,loss,vjepa.tubelet")
    assert result.exit_code == 0, result.stderr
    tables = [block.splitlines() for block in result.stdout.strip().split("\n\n")]
    assert [[line.split() for line in lines[1:]] for lines in tables] == [
        [["run", "lr", "loss", "vjepa.tubelet"], ["a", "0.001", "0.5", "-"]],
        [["run", "lr", "loss", "vjepa.tubelet"], ["c", "0.002", "-", "2"]]]


@pytest.mark.slow
def test_runs_column_that_no_run_has_is_one_line(run_cli, tmp_path):
    three_objectives(tmp_path)
    assert_user_error(run_cli("runs", tmp_path, "--columns", "lr,widht"), "--columns widht: no such column")


def probe_of_embeddings(path: Path, kind: str, run: Path, step: int, top1: float, top5: float | None) -> None:
    """What `jepa probe KIND emb-train.zarr emb-test.zarr --json` writes of embeddings of RUN's step."""
    encoder = {"run": str(run.resolve()), "step": step, "weights": "target", "layers": None, "pool": "mean",
               "source": "/data/d.zarr"}
    path.write_text(json.dumps({"probe": kind, "top1": top1, "top5": top5, "n_train": 10, "n_test": 4,
                                "encoder": encoder, "train": "emb-train.zarr", "test": "emb-test.zarr"}))


@pytest.mark.slow
def test_runs_shows_the_probe_results_written_next_to_a_run(run_cli, tmp_path):
    run = fake_run(tmp_path / "out" / "run-pretrained", "ijepa", {}, metrics=[
        {"step": 2, "loss": 0.9, "knn_top1": 0.3, "knn_top5": 0.6}, {"step": 4, "loss": 0.5}])
    other = fake_run(tmp_path / "out" / "run-init", "ijepa", {})
    probe_of_embeddings(tmp_path / "out" / "probe-knn-pretrained.json", "knn", run, 4, 0.625, 0.875)
    probe_of_embeddings(tmp_path / "out" / "probe-linear-pretrained.json", "linear", run, 4, 0.75, None)
    probe_of_embeddings(tmp_path / "out" / "probe-linear-init.json", "linear", other, 0, 0.125, None)
    table = json.loads(run_cli("runs", tmp_path / "out", "--json").stdout)
    assert [row["probe"] for row in table["runs"]] == [
        {"step": 0, "linear_top1": 0.125, "linear_top5": None},
        {"step": 4, "knn_top1": 0.625, "knn_top5": 0.875, "linear_top1": 0.75, "linear_top5": None}]
    result = run_cli("runs", tmp_path / "out")
    assert [line.split() for line in result.stdout.splitlines()] == [
        ["run", "objective", "step", "status", "loss", "probe_step", "knn_top1", "knn_top5", "linear_top1",
         "linear_top5"],
        ["run-init", "ijepa", "0/4", "finished", "-", "0", "-", "-", "0.125", "-"],
        ["run-pretrained", "ijepa", "4/4", "finished", "0.5", "4", "0.625", "0.875", "0.75", "-"]]


@pytest.mark.slow
def test_runs_probes_reads_probe_results_of_the_run_below_a_folder(run_cli, tmp_path, monkeypatch):
    run = fake_run(tmp_path / "runs" / "r", "ijepa", {}, metrics=[{"step": 4, "loss": 0.5, "knn_top1": 0.25}])
    (tmp_path / "scores" / "deep").mkdir(parents=True)
    results = [{"step": 2, "top1": 0.5, "top5": None}, {"step": 4, "top1": 0.375, "top5": None}]
    (tmp_path / "scores" / "deep" / "all.json").write_text(json.dumps(
        {"probe": "knn", "run": "runs/r", "train": "t.zarr", "test": "v.zarr", "weights": "target", "k": 20,
         "results": results}))  # `jepa probe knn ... --run runs/r --step all --json`, run from tmp_path
    monkeypatch.chdir(tmp_path)
    assert json.loads(run_cli("runs", run, "--json").stdout)["runs"][0]["probe"] == {
        "step": 4, "knn_top1": 0.25, "knn_top5": None}
    assert json.loads(run_cli("runs", run, "--probes", "scores", "--json").stdout)["runs"][0]["probe"] == {
        "step": 4, "knn_top1": 0.375, "knn_top5": None}


# A short run's EMA: the weight its target encoder keeps of its initialisation.

def ramp_kept(start: float, end: float, steps: int) -> float:
    """prod_t m_t of I-JEPA's linear ramp start -> end over the run's `steps` updates, m_t = start + t (end -
    start) / steps for update t = 0 .. steps - 1."""
    return math.prod(start + t * (end - start) / steps for t in range(steps))


def ijepa_of(steps: int, ema: tuple[float, float] = (0.996, 1.0)):
    from jepa_cli.objectives.ijepa import IJEPAObjective
    from jepa_cli.objectives.ijepa_config import IJEPAConfig

    return IJEPAObjective(dataclasses.replace(IJEPAConfig(), ema=ema, total_updates=float(steps)))


def test_a_100_update_run_of_the_default_ema_range_is_warned_with_the_weight_its_target_keeps():
    from jepa_cli.training.ema import ema_warning

    kept = ramp_kept(0.996, 1.0, 100)  # about 0.82
    assert ema_warning(ijepa_of(100), 100).startswith(
        f"the target encoder keeps {kept:.2f} of its random initialisation over the run's 100 updates "
        "(EMA momentum 0.996 -> 1)")


def test_a_10000_update_run_of_the_default_ema_range_is_not_warned():
    from jepa_cli.training.ema import ema_warning

    assert ramp_kept(0.996, 1.0, 10_000) < 1e-6
    assert ema_warning(ijepa_of(10_000), 10_000) is None


def test_the_ema_warning_suggests_the_highest_start_that_keeps_a_tenth_or_less():
    from jepa_cli.training.ema import ema_warning

    warning = ema_warning(ijepa_of(100), 100)
    start = float(warning.split("--ema ")[1].split(",")[0])
    assert ramp_kept(start, 1.0, 100) <= 0.1 < ramp_kept(start + 0.001, 1.0, 100)


@pytest.mark.slow
def test_ema_is_a_train_option(run_cli, tmp_path):
    import tomllib

    from jepa_cli.data import store

    data = tmp_path / "d.zarr"
    store.write_group(data, store.base_attributes("dataset", modality="image", layout="NHWC", class_names=[]))
    store.write_array(data / "inputs", np.zeros((8, 16, 16, 1), np.uint8))
    r = run_cli("train", "--data", data, "-o", tmp_path / "run", "--steps", "100", "--model", "tiny", "--patch-size",
                "2", "--batch-size", "8", "--ema", "0.95,1", "--print-config")
    assert r.exit_code == 0, r.stderr
    assert tomllib.loads(r.stdout)["ijepa"]["ema"] == [0.95, 1.0]


@pytest.mark.slow
def test_a_short_run_warns_that_its_target_encoder_keeps_its_initialisation(run_cli, tmp_path):
    from jepa_cli.data import store

    data = tmp_path / "toy.zarr"
    store.write_group(data, store.base_attributes("dataset", modality="image", layout="NHWC", class_names=[]))
    store.write_array(data / "inputs", np.random.default_rng(0).integers(0, 256, (32, 8, 8, 1), dtype=np.uint8))
    r = run_cli("train", "--objective", "toy_objective:make", "--mesh", "data=1", "--batch-size", "16", "--data", data,
                "--out", tmp_path / "run", "--steps", "3", "--json")
    assert r.exit_code == 0, r.stderr
    kept = ramp_kept(0.99, 1.0, 3)  # the toy objective's ramp, 0.99 -> 1
    assert f"jepa: warning: the target encoder keeps {kept:.2f} of its random initialisation" in r.stderr
    inspected = run_cli("ema-inspect", tmp_path / "run", "--json")
    assert json.loads(inspected.stdout)["init_weight"] == pytest.approx(kept, rel=1e-6)
    assert f"jepa: warning: the target encoder of {tmp_path / 'run'} still holds {kept:.2f} of its random " \
           "initialisation at step 3" in inspected.stderr
