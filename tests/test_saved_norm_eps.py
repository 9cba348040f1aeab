"""A run's saved config without `norm_eps` (run.json, or the copy kept with each checkpoint) is read
with the LayerNorm epsilon its model was built with, 1e-6, for every objective that has the option;
a new run records the objective's default (1e-5 for Audio-JEPA) explicitly."""

from __future__ import annotations

import json

import pytest

# 8 kHz, 0.5 s clips, 16 frames x 16 mel, patch 4
TINY_AUDIO = dict(model="tiny", width=32, depth=1, heads=2, pred_width=16, pred_depth=1, pred_heads=2, patch_size=4,
                  sample_rate=8000, seconds=0.5, frames=16, mel_bins=16, fmax=4000.0)


def _audio_run(tmp_path, objective_config: dict) -> tuple:
    """RUN/run.json of an audio-jepa run with `objective_config`, as the trainer writes it."""
    from jepa_cli.training.config import build_config, resolve_lengths

    cfg = build_config({"objective": "audio-jepa", "objective_config": dict(objective_config), "steps": 2,
                        "batch_size": 2, "out": str(tmp_path / "run")})
    lengths = resolve_lengths(cfg, 4)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text(json.dumps({"config": cfg.to_dict(), "lengths": lengths}))
    return tmp_path / "run", cfg.to_dict(), lengths


def test_a_new_audio_run_records_norm_eps_1e_5():
    from jepa_cli.training.run import make_objective, objective_config_of

    recorded = objective_config_of(make_objective("audio-jepa", TINY_AUDIO), TINY_AUDIO)
    assert recorded["norm_eps"] == 1e-5


@pytest.mark.slow
def test_run_json_without_norm_eps_reads_as_1e_6_for_an_audio_run(tmp_path):
    from jepa_cli.training.runfiles import read_run

    run, _, _ = _audio_run(tmp_path, TINY_AUDIO)
    assert "norm_eps" not in json.loads((run / "run.json").read_text())["config"]["objective_config"]
    assert read_run(run)["config"]["objective_config"]["norm_eps"] == 1e-6


@pytest.mark.slow
def test_a_checkpoint_config_without_norm_eps_builds_the_model_with_1e_6(tmp_path):
    from jepa_cli.training.run import _model_of

    run, config, lengths = _audio_run(tmp_path, TINY_AUDIO)
    saved_with_it = _model_of({**config, "objective_config": {**TINY_AUDIO, "norm_eps": 1e-5}, "lengths": lengths},
                              {"lengths": lengths})
    saved_without = _model_of({**config, "lengths": lengths}, {"lengths": lengths})
    assert saved_with_it[1].model_config.norm_eps == 1e-5
    assert saved_without[1].model_config.norm_eps == 1e-6
    assert saved_without[0]["objective_config"]["norm_eps"] == 1e-6


@pytest.mark.slow
def test_resuming_a_run_saved_without_norm_eps_keeps_1e_6(tmp_path):
    from jepa_cli.training.config import resolve_config

    run, _, _ = _audio_run(tmp_path, TINY_AUDIO)
    cfg = resolve_config({"out": str(run), "steps": 4}, resume=True)
    assert cfg.objective_config["norm_eps"] == 1e-6


@pytest.mark.parametrize("objective", ["ijepa", "vjepa", "audio-jepa", "lejepa"])
def test_every_objective_with_norm_eps_is_read_back_with_1e_6(objective):
    import dataclasses

    from jepa_cli.objectives import OBJECTIVES
    from jepa_cli.training.runfiles import NORM_EPS_OBJECTIVES, saved_config

    with_option = {name for name, cls in OBJECTIVES.items()
                   if "norm_eps" in {f.name for f in dataclasses.fields(cls().config)}}
    assert with_option == set(NORM_EPS_OBJECTIVES)
    assert saved_config({"objective": objective, "objective_config": {}})["objective_config"] == {"norm_eps": 1e-6}
    assert saved_config({"objective": objective, "objective_config": {"norm_eps": 1e-5}})["objective_config"] == {
        "norm_eps": 1e-5}
