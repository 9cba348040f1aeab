"""jepa_cli/options.py: an objective option's command-line form comes from its dataclass field."""

from __future__ import annotations

import dataclasses

import pytest

from jepa_cli import options
from jepa_cli.errors import InputError


@dataclasses.dataclass(frozen=True)
class _Example:
    steps: int = options.option(4, "Updates.", flag=True)
    scale: tuple[float, float] = options.option((0.15, 0.2), "A range.", flag=True)
    size: int | tuple[int, int] = options.option(224, "A size.", flag=True)
    grid: tuple[int, int] = options.option((16, 8), "A grid.")
    per_pair: tuple[tuple[float, float], ...] = options.option(((0.1, 0.2), (0.7, 0.7)), "Per pair.")
    loss: str = options.option("l1", "A choice.", flag=True, choices=("l1", "l2"))
    switch: bool = options.option(False, "A switch.", flag=True)
    ratio: float | None = options.option(None, "Optional.", flag=True)
    plain: int = 3  # no help: not an option


def test_each_annotation_gets_its_kind_and_only_flagged_fields_are_flags():
    kinds = {flag.name: flag.kind for flag in options.flags(_Example, flagged_only=False)}
    assert kinds == {"steps": "int", "scale": "range", "size": "size", "grid": "size", "per_pair": "list",
                     "loss": "str", "switch": "bool", "ratio": "float"}
    assert [flag.name for flag in options.flags(_Example)] == ["steps", "scale", "size", "loss", "switch", "ratio"]


def test_defaults_are_shown_as_the_command_line_writes_them():
    shown = {flag.name: flag.default_text for flag in options.flags(_Example, flagged_only=False)}
    assert shown == {"steps": "4", "scale": "0.15,0.2", "size": "224", "grid": "16x8", "per_pair": "0.1:0.2,0.7:0.7",
                     "loss": "l1", "switch": "false", "ratio": None}


@pytest.mark.parametrize("name, text, value", [
    ("steps", "12", 12), ("scale", "0.1, 0.3", [0.1, 0.3]), ("size", "32", 32), ("size", "32x32", 32),
    ("size", "32x48", [32, 48]), ("loss", "l2", "l2"), ("switch", "no", False), ("ratio", "0.5", 0.5),
])
def test_text_is_read_as_the_toml_key_would_hold_it(name, text, value):
    flag = next(f for f in options.flags(_Example) if f.name == name)
    assert options.parse(flag, text, "--x") == value


@pytest.mark.parametrize("name, text, message", [
    ("steps", "many", "JEPA_TRAIN_X must be an integer, got 'many'"),
    ("scale", "0.1", "JEPA_TRAIN_X must be two numbers such as 0.15,0.2, got '0.1'"),
    ("size", "-4", "JEPA_TRAIN_X must be positive S or HxW such as 224 or 224x320, got '-4'"),
    ("loss", "l3", "JEPA_TRAIN_X must be one of l1, l2, got 'l3'"),
    ("switch", "maybe", "JEPA_TRAIN_X must be true or false, got 'maybe'"),
])
def test_bad_text_names_its_source(name, text, message):
    flag = next(f for f in options.flags(_Example) if f.name == name)
    with pytest.raises(InputError) as error:
        options.parse(flag, text, "JEPA_TRAIN_X")
    assert str(error.value) == message


def test_every_objective_option_is_declared_with_its_help():
    from jepa_cli.masks.config import MultiBlock3DConfig, MultiBlockConfig, RandomConfig
    from jepa_cli.objectives.audio_jepa_config import AudioJEPAConfig
    from jepa_cli.objectives.genconfig import GenerativeConfig
    from jepa_cli.objectives.ijepa_config import IJEPAConfig
    from jepa_cli.objectives.vjepa import VJEPAConfig

    undeclared = {cls.__name__: [f.name for f in dataclasses.fields(cls)
                                 if "help" not in f.metadata and f.name != "mask_options"]  # mask_options: overrides
                  for cls in (IJEPAConfig, VJEPAConfig, AudioJEPAConfig, GenerativeConfig, MultiBlockConfig,
                              MultiBlock3DConfig, RandomConfig)}
    assert undeclared == {name: [] for name in undeclared}


def test_a_reused_option_keeps_its_help_with_the_new_default():
    from jepa_cli.models.config import ModelConfig
    from jepa_cli.objectives.audio_jepa_config import AudioJEPAConfig

    ours = {f.name: f for f in dataclasses.fields(AudioJEPAConfig)}
    model = {f.name: f for f in dataclasses.fields(ModelConfig)}
    assert ours["model"].default == "base" and model["model"].default == "tiny"
    assert ours["model"].metadata["help"] == model["model"].metadata["help"]
