"""The built-in small-data Audio-JEPA recipe (builtin:audio-jepa-small): it loads, every key validates,
and it builds the time-strip model with the anti-collapse terms on 1 s clips at 16 kHz."""

from jepa_cli.objectives import make_objective
from jepa_cli.training.config import build_config, builtin_recipes, load_toml


def test_audio_jepa_small_is_a_builtin_recipe_whose_trainer_keys_validate():
    assert "audio-jepa-small" in builtin_recipes()
    recipe = load_toml("builtin:audio-jepa-small")
    cfg = build_config(recipe)
    assert (cfg.objective, cfg.steps, cfg.batch_size, cfg.lr) == ("audio-jepa", 1600, 32, 5e-4)


def test_audio_jepa_small_reads_one_second_at_16khz_as_32_time_strips_with_anticollapse_terms():
    options = load_toml("builtin:audio-jepa-small")["objective_config"]
    objective = make_objective("audio-jepa", {**options, "sample_rate": 16000, "seconds": 1.0})
    cfg = objective.config
    assert cfg.patch_shape == (2, 32) and cfg.model_config.grid == (32, 1)  # 2 frames across all 32 mel bins
    assert cfg.mask_config.ratio == (0.8, 0.9)
    assert (cfg.var_weight, cfg.var_target, cfg.cov_weight) == (1.0, 1.0, 0.1)
    assert tuple(cfg.ema) == (0.99, 1.0)  # Audio-JEPA: 0.996; from 0.99 the target follows within 1,600 updates
