"""scripts/recipe_sweep.py: a variant's recipe is the base recipe with its overrides, and loads."""

from __future__ import annotations

import importlib.util
import json
import tomllib
from pathlib import Path

import pytest
import tomli_w

from jepa_cli.training.config import load_toml, recipe_path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("recipe_sweep", ROOT / "scripts" / "recipe_sweep.py")
recipe_sweep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(recipe_sweep)


def test_variant_recipe_sets_top_level_and_section_keys_and_leaves_the_base_alone():
    base = {"seed": 0, "steps": 1500, "ijepa": {"depth": 6, "crop_scale": [0.3, 1.0]}}
    variant = recipe_sweep.variant_recipe(base, {"seed": 1, "ijepa.crop_scale": [0.5, 1.0], "ijepa.loss": "l2"})
    assert variant == {"seed": 1, "steps": 1500, "ijepa": {"depth": 6, "crop_scale": [0.5, 1.0], "loss": "l2"}}
    assert base == {"seed": 0, "steps": 1500, "ijepa": {"depth": 6, "crop_scale": [0.3, 1.0]}}


@pytest.mark.slow
def test_every_variant_of_the_documented_sweeps_is_a_valid_recipe(tmp_path):
    base = tomllib.loads(recipe_path("builtin:ijepa-small32").read_text())
    for round_file in sorted((ROOT / "scripts").glob("small32-sweep-round*.json")):
        for variant in json.loads(round_file.read_text()):
            path = tmp_path / f"{variant['name']}.toml"
            path.write_text(tomli_w.dumps(recipe_sweep.variant_recipe(base, variant["set"])))
            loaded = load_toml(path)  # InputError on an unknown key or a bad value
            assert loaded["steps"] == 1500
