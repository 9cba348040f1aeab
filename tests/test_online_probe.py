"""`jepa train --probe-every N --probe-data TRAIN,TEST`: the k-NN probe of the target encoder during
training, written to metrics.jsonl, equal to `jepa probe knn` on the same checkpoint's embeddings."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from conftest import assert_user_error
from test_encode import RECIPE, image_dataset

pytestmark = pytest.mark.slow

TRAIN = ["train", "--pred-depth", "1", "--steps", "4", "--batch-size", "8", "--mesh", "data=1", "-q"]


def one_block_recipe(folder) -> list[str]:
    """--config of the tiny digits recipe with one encoder block (and one predictor block, TRAIN): a
    quarter of its compile, the same probe."""
    path = folder / "one-block.toml"
    path.write_text(re.sub(r"(?m)^depth = 4", "depth = 1", RECIPE.read_text()))
    return ["--config", str(path)]


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """A 4-update run probed every 2 updates, checkpointed at 2 and 4."""
    from jepa_cli.cli.main import cli

    root = tmp_path_factory.mktemp("online")
    data = image_dataset(root / "data.zarr", n=40, seed=0)
    probe_train = image_dataset(root / "probe-train.zarr", n=30, seed=1)
    probe_test = image_dataset(root / "probe-test.zarr", n=12, seed=2)
    result = CliRunner().invoke(cli, [*TRAIN, *one_block_recipe(root), "--data", str(data), "--out", str(root / "run"),
                                      "--save-every", "2",
                                      "--probe-every", "2", "--probe-data", f"{probe_train},{probe_test}",
                                      "--probe-k", "5", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    return {"root": root, "run": root / "run", "data": data, "probe_train": probe_train, "probe_test": probe_test,
            "rows": rows, "summary": json.loads(result.stdout)}


def test_probe_rows_at_step_zero_and_every_n_updates(probed):
    steps = [row["step"] for row in probed["rows"] if "knn_top1" in row]
    assert steps == [0, 2, 4]
    probe_rows = [row for row in probed["rows"] if "knn_top1" in row]
    assert all(0.0 <= row["knn_top1"] <= 1.0 for row in probe_rows)
    assert all(row["knn_top5"] is None for row in probe_rows)  # 3 classes: a top-5 would always be 1
    assert all(row["probe_seconds"] > 0 for row in probed["rows"] if "knn_top1" in row)


def test_the_json_summary_carries_the_last_probe(probed):
    last = [row for row in probed["rows"] if "knn_top1" in row][-1]
    assert probed["summary"]["probe"]["step"] == 4
    assert probed["summary"]["probe"]["knn_top1"] == last["knn_top1"]


def test_run_json_records_the_probe_options(probed):
    config = json.loads((probed["run"] / "run.json").read_text())["config"]
    assert (config["probe_every"], config["probe_k"]) == (2, 5)
    assert config["probe_data"].endswith("probe-test.zarr")


def test_training_time_knn_equals_jepa_probe_knn_on_the_checkpoints_embeddings(probed, run_cli):
    """At the last checkpoint, through encode-latents then probe (the next test compares every
    checkpoint through probe --run)."""
    root, step = probed["root"], 4
    for name in ("probe_train", "probe_test"):
        result = run_cli("encode-latents", probed["run"], probed[name], "-o", root / f"emb-{name}-{step}.zarr",
                         "--step", step, "--mesh", "data=1", "-q")
        assert result.exit_code == 0, result.stderr
    result = run_cli("probe", "knn", root / f"emb-probe_train-{step}.zarr", root / f"emb-probe_test-{step}.zarr",
                     "--k", "5", "--json")
    assert result.exit_code == 0, result.stderr
    offline = json.loads(result.stdout)
    online = next(row for row in probed["rows"] if row["step"] == step and "knn_top1" in row)
    assert (online["knn_top1"], online["knn_top5"]) == (offline["top1"], offline["top5"])


def test_probe_run_step_all_gives_the_training_time_curve_after_the_fact(probed, run_cli):
    result = run_cli("probe", "knn", probed["probe_train"], probed["probe_test"], "--run", probed["run"],
                     "--step", "all", "--k", "5", "--json")
    assert result.exit_code == 0, result.stderr
    after = {row["step"]: (row["top1"], row["top5"]) for row in json.loads(result.stdout)["results"]}
    online = {row["step"]: (row["knn_top1"], row["knn_top5"]) for row in probed["rows"] if "knn_top1" in row}
    assert sorted(after) == [2, 4]
    assert all(after[step] == online[step] for step in after)


def test_probe_run_with_attentive_or_step_without_run_is_one_line(probed, run_cli):
    assert_user_error(run_cli("probe", "attentive", probed["probe_train"], probed["probe_test"], "--run",
                              probed["run"]), "knn or linear")
    assert_user_error(run_cli("probe", "knn", probed["probe_train"], probed["probe_test"], "--step", "all"),
                      "--step needs --run")
    assert_user_error(run_cli("probe", "knn", probed["probe_train"], probed["probe_test"], "--run", probed["run"],
                              "--step", "7"), "no checkpoint at step 7")


def _refused(run_cli, tmp_path, *extra, fragments=()):
    data = image_dataset(tmp_path / "data.zarr", n=40)
    out = tmp_path / "run"
    assert_user_error(run_cli(*TRAIN, *one_block_recipe(tmp_path), "--data", data, "--out", out, *extra), *fragments)
    assert not out.exists()


def test_probe_every_without_probe_data_is_refused_before_the_run_exists(run_cli, tmp_path):
    _refused(run_cli, tmp_path, "--probe-every", "2", fragments=("--probe-data",))


def test_probe_data_that_is_not_two_paths_is_refused(run_cli, tmp_path):
    _refused(run_cli, tmp_path, "--probe-every", "2", "--probe-data", str(tmp_path / "one.zarr"),
             fragments=("TRAIN.zarr,TEST.zarr",))


def test_a_missing_probe_dataset_is_named(run_cli, tmp_path):
    present = image_dataset(tmp_path / "p.zarr", n=20)
    _refused(run_cli, tmp_path, "--probe-every", "2", "--probe-data", f"{present},{tmp_path / 'gone.zarr'}",
             fragments=("gone.zarr",))


def test_an_unlabelled_probe_dataset_is_refused(run_cli, tmp_path):
    unlabelled = image_dataset(tmp_path / "u.zarr", n=20, labels=False)
    _refused(run_cli, tmp_path, "--probe-every", "2", "--probe-data", f"{unlabelled},{unlabelled}",
             fragments=("u.zarr", "labels"))


def test_a_probe_dataset_with_other_channels_is_refused(run_cli, tmp_path):
    rgb = image_dataset(tmp_path / "rgb.zarr", n=20, channels=3)
    _refused(run_cli, tmp_path, "--probe-every", "2", "--probe-data", f"{rgb},{rgb}", fragments=("rgb.zarr", "channel"))


def test_fewer_probe_samples_than_k_is_refused(run_cli, tmp_path):
    small = image_dataset(tmp_path / "s.zarr", n=4)
    _refused(run_cli, tmp_path, "--probe-every", "2", "--probe-data", f"{small},{small}", fragments=("k=20",))
