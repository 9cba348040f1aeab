"""`sigreg_quality`: SIGReg of the target encoder's pooled features of a fixed batch on fixed directions,
logged by the trainer every --log-every updates, shown by `jepa runs`, drawn by `jepa plot`, and
computed again from every checkpoint by `quality_run`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from test_encode import image_dataset
from test_online_probe import TRAIN, one_block_recipe

N_EXAMPLES = 24  # the run's --quality-batch: fewer than the dataset's 40


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """A 4-update run logged and checkpointed at 2 and 4, scoring the first N_EXAMPLES examples."""
    from jepa_cli.cli.main import cli

    root = tmp_path_factory.mktemp("quality")
    data = image_dataset(root / "data.zarr", n=40, seed=0)
    result = CliRunner().invoke(cli, [*TRAIN, *one_block_recipe(root), "--data", str(data), "--out", str(root / "run"),
                                      "--save-every", "2", "--keep", "0", "--log-every", "2", "--seed", "3",
                                      "--quality-batch", str(N_EXAMPLES)], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    return {"root": root, "run": root / "run", "data": data, "rows": rows}


def _sigreg_by_hand(features: np.ndarray, seed: int) -> float:
    """The figure from its definition: centre, one global scale to mean variance 1, the run's directions,
    Epps-Pulley with the reference's 17 knots on [0, 3], in float64."""
    import jax

    from jepa_cli.evaluation.quality import DIRECTIONS_STREAM

    x = features.astype(np.float64)
    x = x - x.mean(axis=0)
    x = x / np.sqrt(np.mean(x ** 2))
    a = np.asarray(jax.random.normal(jax.random.fold_in(jax.random.PRNGKey(seed), DIRECTIONS_STREAM),
                                     (x.shape[1], 256), np.float32), np.float64)
    proj = x @ (a / np.linalg.norm(a, axis=0))  # [N, 256]
    t = np.linspace(0.0, 3.0, 17)
    dt = t[1] - t[0]
    weights = np.full(17, 2 * dt)
    weights[[0, -1]] = dt
    ecf = np.exp(1j * proj[..., None] * t).mean(axis=0)  # [256, 17]
    err = np.abs(ecf - np.exp(-t ** 2 / 2)) ** 2
    return float(np.mean(err @ (weights * np.exp(-t ** 2 / 2)) * len(x)))


@pytest.mark.slow
def test_rows_of_the_logged_steps_carry_the_figure(logged):
    steps = [row["step"] for row in logged["rows"] if row.get("sigreg_quality") is not None]
    assert steps == [2, 4]


@pytest.mark.slow
def test_the_logged_figure_is_sigreg_of_the_checkpoints_features_on_the_first_examples(logged):
    from jepa_cli.api import load_run
    from jepa_cli.data import store

    raw = store.read_array(logged["data"] / "inputs")[:N_EXAMPLES]
    for step in (2, 4):
        features = load_run(logged["run"], step).encode(raw)
        logged_value = next(row["sigreg_quality"] for row in logged["rows"] if row["step"] == step)
        assert logged_value == pytest.approx(_sigreg_by_hand(features, seed=3), rel=1e-4)


@pytest.mark.slow
def test_quality_run_gives_the_logged_figures_of_every_checkpoint(logged):
    from jepa_cli.evaluation.quality import quality_run

    after = {row["step"]: row["sigreg_quality"] for row in quality_run(logged["run"], "all")}
    logged_values = {row["step"]: row["sigreg_quality"] for row in logged["rows"] if "sigreg_quality" in row}
    assert sorted(after) == [2, 4]
    assert all(after[step] == pytest.approx(logged_values[step], rel=1e-5) for step in after)


@pytest.mark.slow
@pytest.mark.parametrize("name, modality", [("audio-jepa", "audio"), ("vjepa", "video")])
def test_the_other_jepa_objectives_log_it_too(run_cli, tmp_path, name, modality):
    from test_anticollapse import CASES, _dataset, _recipe

    data = _dataset(tmp_path / "d.zarr", modality)
    recipe = _recipe(tmp_path / "r.toml", name, CASES[name][0], steps=2, batch_size=8, warmup_steps=1, log_every=2,
                     mesh="data=1")
    result = run_cli("train", "--config", recipe, "--data", data, "--out", tmp_path / "run", "--quiet")
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [2] and rows[0]["sigreg_quality"] > 0


@pytest.mark.slow
def test_a_collapsed_encoder_scores_higher_than_a_random_one(tmp_path):
    import jax

    from jepa_cli.evaluation.quality import QualitySignal
    from jepa_cli.objectives import make_objective

    data = image_dataset(tmp_path / "data.zarr", n=64, seed=0)
    objective = make_objective("ijepa", {"model": "tiny", "depth": 1, "width": 32, "heads": 2, "patch_size": 4,
                                         "image_size": 16, "channels": 1})
    encoder = objective.init(jax.random.PRNGKey(0))["encoder"]
    collapsed = {**encoder, "norm": jax.tree.map(np.zeros_like, encoder["norm"])}  # the final LayerNorm outputs 0
    signal = QualitySignal(objective, data, 64, seed=0)
    assert float(signal(collapsed)) > 2 * float(signal(encoder))


def test_constant_features_score_as_collapsed_despite_float_rounding():
    """Constant features with float32-sized jitter score as exactly constant ones, not as the jitter
    scaled up to unit variance."""
    from jepa_cli.evaluation.quality import quality_directions, quality_statistic

    directions = quality_directions(0, 16)
    constant = np.full((128, 16), 0.7, np.float32)
    jitter = np.random.default_rng(0).normal(0, 1e-7, constant.shape).astype(np.float32)
    assert float(quality_statistic(constant + jitter, directions)) == pytest.approx(
        float(quality_statistic(constant, directions)), rel=1e-3)


@pytest.mark.slow
def test_quality_batch_zero_logs_no_figure(tmp_path, run_cli):
    data = image_dataset(tmp_path / "data.zarr", n=40)
    result = run_cli(*TRAIN, *one_block_recipe(tmp_path), "--data", data, "--out", tmp_path / "run",
                     "--steps", "1", "--quality-batch", "0")
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows and not any("sigreg_quality" in row for row in rows)


@pytest.mark.slow
def test_the_key_comes_from_a_recipe_and_its_default_is_256(tmp_path):
    from jepa_cli.training.config import TrainConfig, resolve_config

    recipe = tmp_path / "r.toml"
    recipe.write_text("quality_batch = 64\n")
    assert resolve_config({}, recipe).quality_batch == 64
    assert TrainConfig().quality_batch == 256


@pytest.mark.slow
def test_run_json_records_the_key(logged):
    assert json.loads((logged["run"] / "run.json").read_text())["config"]["quality_batch"] == N_EXAMPLES


@pytest.mark.slow
def test_the_key_is_declared_once_and_refuses_a_negative_count(run_cli, tmp_path):
    from jepa_cli.training.config import TRAINER_KEYS

    assert "quality_batch" in TRAINER_KEYS
    result = run_cli("train", "--help")
    assert "--quality-batch" in result.stdout
    bad = run_cli("train", "--data", tmp_path / "d.zarr", "--out", tmp_path / "run", "--steps", "1",
                  "--quality-batch", "-1")
    assert bad.exit_code == 2 and "--quality-batch" in bad.stderr


@pytest.mark.slow
def test_jepa_runs_shows_the_last_logged_figure(logged, run_cli):
    result = run_cli("runs", logged["run"], "--json")
    assert result.exit_code == 0, result.stderr
    last = [row["sigreg_quality"] for row in logged["rows"] if "sigreg_quality" in row][-1]
    assert json.loads(result.stdout)["runs"][0]["sigreg_quality"] == last
    table = run_cli("runs", logged["run"])
    assert "sigreg_quality" in table.stdout.splitlines()[0]


@pytest.mark.slow
def test_jepa_plot_draws_it_by_default(logged, run_cli, tmp_path):
    result = run_cli("plot", logged["run"], "-o", tmp_path / "curves.png", "--json")
    assert result.exit_code == 0, result.stderr
    assert "sigreg_quality" in json.loads(result.stdout)["metrics"]
