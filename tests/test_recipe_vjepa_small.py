"""The built-in small-data V-JEPA recipe (builtin:vjepa-small): it loads, every key validates, and it
builds the tiny recipe's 4 x 4 x 4 tubelet model with the anti-collapse terms and the faster EMA ramp."""

from jepa_cli.objectives import make_objective
from jepa_cli.training.config import build_config, builtin_recipes, load_toml


def test_vjepa_small_is_a_builtin_recipe_whose_trainer_keys_validate():
    assert "vjepa-small" in builtin_recipes()
    cfg = build_config(load_toml("builtin:vjepa-small"))
    assert (cfg.objective, cfg.steps, cfg.batch_size, cfg.lr, cfg.warmup_steps) == ("vjepa", 2500, 32, 5e-4, 150)


def test_vjepa_small_reads_16_frames_of_32x32_as_64_tubelets_with_anticollapse_terms():
    options = load_toml("builtin:vjepa-small")["objective_config"]
    objective = make_objective("vjepa", {**options, "num_frames": 16, "channels": 1})
    cfg = objective.config
    assert (cfg.model_config.grid3d, cfg.model_config.num_patches) == ((4, 4, 4), 64)  # 16 / tubelet 4, 32 / patch 8
    assert (cfg.var_weight, cfg.var_target, cfg.cov_weight) == (1.0, 1.0, 0.1)
    assert tuple(cfg.ema) == (0.99, 1.0)
