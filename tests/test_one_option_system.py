"""One option system and one environment-variable rule: a trainer key and an objective option are
declared the same way (jepa_cli/options.py); a value's text reads the same from the command line, a
JEPA_<COMMAND>_<KEY> variable and, as TOML holds it, a recipe; a bad value is the same one line from each
source, naming it; every command reads its variables below its command line and refuses a misspelt one."""

from __future__ import annotations

import importlib

import pytest
from conftest import assert_user_error

from jepa_cli import options
from jepa_cli.errors import InputError
from jepa_cli.training.config import TRAINER_FLAGS, load_toml


def _params(monkeypatch, command: str, args: list[str], environ: dict[str, str] | None = None) -> dict:
    """The values `jepa COMMAND ARGS` hands its function, with `environ` set (parsing only, nothing runs)."""
    from jepa_cli.cli.main import COMMANDS

    for name, value in (environ or {}).items():
        monkeypatch.setenv(name, value)
    click_command = importlib.import_module(COMMANDS[command][0]).command
    prefix = "JEPA_" + command.upper().replace("-", "_")
    return click_command.make_context(command, list(args), auto_envvar_prefix=prefix).params


# --- the HxW text: one parser, the same size from every source ---


@pytest.mark.parametrize("text, size", [("224", (224, 224)), ("224x320", (224, 320)), ("8 X 12", (8, 12))])
def test_hxw_text_is_height_then_width_and_one_number_is_a_square(text, size):
    assert options.parse_hxw(text, "--size") == size


@pytest.mark.parametrize("text", ["0x4", "4x0", "-4", "8x", "8x12x3", "8by12", ""])
def test_hxw_text_that_is_not_one_or_two_positive_integers_is_refused_naming_its_source(text):
    with pytest.raises(InputError) as error:
        options.parse_hxw(text, "JEPA_INGEST_SIZE")
    assert str(error.value) == f"JEPA_INGEST_SIZE must be positive S or HxW such as 224 or 224x320, got {text!r}"


@pytest.mark.parametrize("command, args, option, key, expected", [
    ("ingest", ["src", "out.zarr"], "--size", "size", (8, 12)),
    ("mask", [], "--grid", "grid", (8, 12)),
    ("train", [], "--image-size", "image_size", [8, 12]),  # as the recipe's TOML holds it
])
def test_one_hxw_text_is_the_same_size_from_the_command_line_and_the_environment(
        monkeypatch, command, args, option, key, expected):
    variable = f"JEPA_{command.upper()}_{key.upper()}"
    assert _params(monkeypatch, command, [*args, option, "8x12"])[key] == expected
    assert _params(monkeypatch, command, args, {variable: "8x12"})[key] == expected


def test_a_size_given_as_text_is_what_the_recipe_holds(monkeypatch, tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text("[ijepa]\nimage_size = [8, 12]\n")
    assert load_toml(recipe)["objective_config"]["image_size"] == [8, 12]
    assert _params(monkeypatch, "train", ["--image-size", "8x12"])["image_size"] == [8, 12]
    assert _params(monkeypatch, "train", ["--image-size", "12x12"])["image_size"] == 12  # a square: one number


# --- one message for a bad value, whatever gave it ---


@pytest.mark.parametrize("source, message", [
    ("command line", "jepa: error: --batch-size must be an integer >= 1, got 0"),
    ("environment", "jepa: error: JEPA_TRAIN_BATCH_SIZE must be an integer >= 1, got 0"),
    ("recipe", "jepa: error: {recipe}: batch_size must be an integer >= 1, got 0"),
])
def test_a_bad_trainer_value_is_the_same_line_from_each_source(run_cli, tmp_path, source, message):
    recipe = tmp_path / "r.toml"
    recipe.write_text("batch_size = 0\n")
    args = ["train", "--data", tmp_path / "none.zarr", "-o", tmp_path / "run"]
    if source == "command line":
        r = run_cli(*args, "--batch-size", "0")
    elif source == "environment":
        r = run_cli(*args, env={"JEPA_TRAIN_BATCH_SIZE": "0"})
    else:
        r = run_cli(*args, "--config", recipe)
    assert_user_error(r)
    assert r.stderr.strip() == message.format(recipe=recipe)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command, args, option, variable", [
    ("ingest", ["builtin:digits", "{out}"], "--size", "JEPA_INGEST_SIZE"),
    ("mask", [], "--grid", "JEPA_MASK_GRID"),
    ("train", ["--data", "{out}", "-o", "{out}"], "--image-size", "JEPA_TRAIN_IMAGE_SIZE"),
])
def test_a_bad_hxw_text_is_the_same_line_from_the_command_line_and_the_environment(
        run_cli, tmp_path, command, args, option, variable):
    args = [a.format(out=tmp_path / "out") for a in args]
    expected = "must be positive S or HxW such as 224 or 224x320, got '8by12'"
    assert run_cli(command, *args, option, "8by12").stderr.strip() == f"jepa: error: {option} {expected}"
    assert run_cli(command, *args, env={variable: "8by12"}).stderr.strip() == f"jepa: error: {variable} {expected}"
    assert not (tmp_path / "out").exists()


def test_a_bad_value_of_an_undeclared_option_names_its_variable(run_cli, tmp_path):
    r = run_cli("ingest", "builtin:digits", tmp_path / "o.zarr", env={"JEPA_INGEST_SEED": "abc"})
    assert_user_error(r, "Invalid value for JEPA_INGEST_SEED: 'abc'")
    assert not (tmp_path / "o.zarr").exists()


# --- the declaration: what a key accepts ---


def _accepts(key: str, value) -> bool:
    try:
        options.check(TRAINER_FLAGS[key], value, key)
    except InputError:
        return False
    return True


def test_a_lower_bound_is_inclusive_with_low_and_exclusive_with_above():
    assert _accepts("start_lr", 0.0) and not _accepts("start_lr", -1e-9)  # low=0
    assert not _accepts("lr", 0.0) and _accepts("lr", 1e-9)  # above=0


def test_an_upper_bound_is_inclusive_with_high_and_exclusive_with_below():
    assert _accepts("collapse_rank_fraction", 1.0) and not _accepts("collapse_rank_fraction", 1.5)  # high=1
    assert _accepts("betas", [0.0, 0.999]) and not _accepts("betas", [0.9, 1.0])  # below=1, each of the pair


def test_an_integer_key_takes_neither_a_float_nor_a_bool():
    assert _accepts("batch_size", 2)
    assert not _accepts("batch_size", 2.0) and not _accepts("batch_size", True)


def test_a_number_key_takes_no_infinity_or_nan():
    assert not _accepts("wd", float("inf")) and not _accepts("wd", float("nan"))


def test_none_is_a_value_only_of_a_key_annotated_as_optional():
    assert _accepts("keep", None)  # int | None, default 3
    assert not _accepts("batch_size", None)  # int


def test_a_choice_key_may_name_a_module_factory_only_where_declared():
    assert _accepts("objective", "mypackage.objectives:make") and not _accepts("objective", "byol")


def test_trainer_keys_and_objective_options_are_declared_with_the_same_option():
    from jepa_cli.objectives.ijepa_config import IJEPAConfig
    from jepa_cli.training.config import TrainConfig

    trainer = options.flags(TrainConfig, flagged_only=False)
    objective = options.flags(IJEPAConfig, flagged_only=False)
    assert {type(flag) for flag in trainer + objective} == {options.Flag}
    assert TRAINER_FLAGS["out"].names == ("--output", "-o", "--out")
    assert (TRAINER_FLAGS["lr"].kind, TRAINER_FLAGS["lr"].default, TRAINER_FLAGS["lr"].above) == ("float", 1e-3, 0)


def test_a_text_key_keeps_its_spaces(monkeypatch):
    assert _params(monkeypatch, "train", ["--data", "my data.zarr"])["data"] == "my data.zarr"
    assert _params(monkeypatch, "train", [], {"JEPA_TRAIN_OUT": "runs/a b"})["out"] == "runs/a b"


@pytest.mark.parametrize("text, value", [("on", True), ("Yes", True), ("1", True), ("off", False), ("n", False)])
def test_a_switch_reads_the_same_words_as_every_other_commands_switches(monkeypatch, text, value):
    assert _params(monkeypatch, "train", [], {"JEPA_TRAIN_ASYNC_CHECKPOINTING": text})["async_checkpointing"] is value
    assert _params(monkeypatch, "ingest", ["src", "out.zarr"], {"JEPA_INGEST_FORCE": text})["force"] is value


# --- one environment-variable rule for every command ---


@pytest.mark.parametrize("command, args, variable, option, key", [
    ("mask", [], "JEPA_MASK_SEED", "--seed", "seed"),
    ("ingest", ["src", "out.zarr"], "JEPA_INGEST_LIMIT", "--limit", "limit"),
    ("train", [], "JEPA_TRAIN_SEED", "--seed", "seed"),
])
def test_every_command_reads_a_variable_below_its_command_line(monkeypatch, command, args, variable, option, key):
    assert _params(monkeypatch, command, args, {variable: "5"})[key] == 5
    assert _params(monkeypatch, command, [*args, option, "7"], {variable: "5"})[key] == 7


def test_an_empty_variable_is_not_set(monkeypatch):
    assert _params(monkeypatch, "train", [], {"JEPA_TRAIN_SEED": ""})["seed"] is None


@pytest.mark.parametrize("command, args, variable, message", [
    ("mask", [], "JEPA_MASK_SEEDS", "JEPA_MASK_SEEDS: `jepa mask` has no option --seeds"),
    ("train", ["--data", "x", "-o", "y"], "JEPA_TRAIN_BATCHSIZE",
     "JEPA_TRAIN_BATCHSIZE: `jepa train` has no option --batchsize"),
    ("mask", [], "JEPA_MASK_BATCH_SIZE", "JEPA_MASK_BATCH_SIZE: `jepa mask --batch-size` is set by JEPA_MASK_BATCH"),
])
def test_a_variable_that_names_no_option_of_its_command_is_refused(run_cli, command, args, variable, message):
    assert_user_error(run_cli(command, *args, env={variable: "3"}), message)


def test_another_commands_variables_an_empty_one_and_help_are_left_alone(run_cli, tmp_path):
    r = run_cli("train", "--data", tmp_path / "none.zarr", "-o", tmp_path / "run",
                env={"JEPA_INGEST_SEEDS": "3", "JEPA_TRAIN_SEEDS": ""})
    assert_user_error(r, "none.zarr")  # the dataset is what is refused, not a variable
    r = run_cli("mask", "--help", env={"JEPA_MASK_SEEDS": "3"})
    assert r.exit_code == 0 and r.stdout.startswith("Usage: jepa mask")


def test_a_variable_under_a_longer_command_prefix_belongs_to_that_command():
    import click

    from jepa_cli.cli.declared import check_variables

    encode = click.Command("encode", params=[click.Option(["--seed"])])
    check_variables(encode, "JEPA_ENCODE_", {"JEPA_ENCODE_LATENTS_OUT": "x"}, ("JEPA_ENCODE_", "JEPA_ENCODE_LATENTS_"))
    with pytest.raises(InputError, match="JEPA_ENCODE_LATENTS_OUT: `jepa encode` has no option --latents-out"):
        check_variables(encode, "JEPA_ENCODE_", {"JEPA_ENCODE_LATENTS_OUT": "x"}, ("JEPA_ENCODE_",))
