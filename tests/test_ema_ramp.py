"""The EMA momentum ramp on a length of its own (trainer keys ema_ramp_steps, ema_ramp_epochs), and the
Audio-JEPA AudioSet-2M recipe that uses it to reproduce the released run."""

from __future__ import annotations

import math

import pytest

from jepa_cli.errors import InputError
from jepa_cli.objectives import make_objective
from jepa_cli.options import check
from jepa_cli.training import config as config_lib
from jepa_cli.training.schedules import ema_ramp_length


def _lengths(num_samples: int = 1000, **keys):
    return config_lib.resolve_lengths(config_lib.build_config({"batch_size": 10, "steps": 50, **keys}), num_samples)


def test_by_default_the_ramp_spans_the_run_times_ipe_scale():
    assert _lengths()["ema_t_max"] == 50.0
    assert _lengths(ipe_scale=1.25)["ema_t_max"] == 62.5


def test_ema_ramp_epochs_counts_updates_per_epoch_and_leaves_the_lr_schedule_alone():
    lengths = _lengths(ema_ramp_epochs=2.5)  # ipe = 1000 // 10 = 100
    assert (lengths["ema_t_max"], lengths["t_max"], lengths["steps"]) == (250.0, 50, 50)


def test_ema_ramp_epochs_times_ipe_is_rounded_to_the_nearest_update():
    assert ema_ramp_length(50, ramp_epochs=0.9, ipe=3) == 3.0  # 2.7 updates
    assert ema_ramp_length(50, ramp_epochs=1.3, ipe=3) == 4.0  # 3.9 updates
    assert ema_ramp_length(50, ramp_epochs=1.4, ipe=3) == 4.0  # 4.2 updates


def test_ema_ramp_steps_wins_over_ema_ramp_epochs():
    assert _lengths(ema_ramp_steps=70, ema_ramp_epochs=2.5)["ema_t_max"] == 70.0
    assert ema_ramp_length(50, 1.0, ramp_steps=70) == 70.0


@pytest.mark.parametrize("key, value, message", [("ema_ramp_steps", 0, "ema_ramp_steps must be an integer in 1.."),
                                                 ("ema_ramp_epochs", 0.0, "ema_ramp_epochs must be a number > 0")])
def test_a_ramp_of_no_length_is_refused(key, value, message):
    with pytest.raises(InputError, match=message):
        check(config_lib.TRAINER_FLAGS[key], value, key)


def test_the_as2m_recipe_stops_at_100k_updates_with_the_ema_ramp_over_50_epochs():
    recipe = config_lib.load_toml("builtin:audio-jepa-as2m")
    cfg = config_lib.build_config({k: v for k, v in recipe.items() if k != "objective_config"})
    lengths = config_lib.resolve_lengths(cfg, 2_000_000)  # AudioSet-2M at batch 256: 7812 updates an epoch
    assert (lengths["steps"], lengths["t_max"], lengths["warmup_steps"]) == (100_000, 100_000, 1000)
    assert lengths["ema_t_max"] == 50 * 7812
    objective = make_objective("audio-jepa", recipe["objective_config"]).with_total_updates(lengths["ema_t_max"])
    end = 1.0 - 0.004 * (math.cos(math.pi * 100_000 / 390_600) + 1.0) / 2.0  # the momentum the run ends at
    assert float(objective.ema_spec.momentum(100_000)) == pytest.approx(end, abs=1e-6)
    assert end == pytest.approx(0.99661, abs=1e-5)


@pytest.mark.slow
def test_ema_inspect_draws_the_whole_ramp_when_it_is_longer_than_the_run(run_cli, tmp_path):
    import json

    import numpy as np

    from jepa_cli.data import store

    data, run = tmp_path / "toy.zarr", tmp_path / "run"
    store.write_group(data, store.base_attributes("dataset", modality="image", layout="NHWC", class_names=[]))
    store.write_array(data / "inputs", np.random.default_rng(0).integers(0, 256, (32, 8, 8, 1), dtype=np.uint8))
    r = run_cli("train", "--objective", "toy_objective:make", "--mesh", "data=1", "--batch-size", "16",
                "--data", data, "--out", run, "--steps", "2", "--ema-ramp-steps", "10", "--json")
    assert r.exit_code == 0, r.stderr
    r = run_cli("ema-inspect", run, "--json")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["total_steps"] == 10  # the ramp's 10 updates, not the run's 2 (t_max 2 at ipe_scale 1)
    assert report["schedule"][-1] == {"step": 10, "momentum": 1.0}  # the toy ramp 0.99 -> 1.0 over 10
    assert report["momentum"] == pytest.approx(0.99 + 2 * 0.01 / 10)
