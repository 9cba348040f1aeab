"""`jepa train`'s configuration: each trainer key declared once (option, TOML key, JEPA_TRAIN_* variable,
help with its default), the layers' order, choices checked before JAX, and the plain progress lines."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest
from conftest import assert_user_error

from jepa_cli.errors import InputError
from jepa_cli.training.config import TRAINER_FLAGS, TrainConfig, load_toml, resolve_config


def test_every_trainer_key_is_an_option_whose_help_shows_its_default(run_cli):
    text = " ".join(run_cli("train", "--help").stdout.split())
    for key in TRAINER_FLAGS.values():
        assert key.flag in text, key.name
    assert "--lr FLOAT Peak learning rate (after the linear warmup). [default: 0.001]" in text
    assert "--betas B1,B2 AdamW betas B1,B2. [default: 0.9,0.999]" in text
    assert "--async-checkpointing / --no-async-checkpointing" in text
    assert "-o, --out, --output TEXT" in text


@pytest.mark.slow
def test_every_trainer_key_is_a_toml_key(tmp_path):
    recipe = tmp_path / "all.toml"
    recipe.write_text("lr = 0.5\nfinal_wd = 0.1\nlog_every = 7\nasync_checkpointing = false\nbetas = [0.9, 0.95]\n")
    assert load_toml(recipe) == {"lr": 0.5, "final_wd": 0.1, "log_every": 7, "async_checkpointing": False,
                                 "betas": [0.9, 0.95]}


def _train_options(monkeypatch, environ: dict[str, str], *args: str) -> dict:
    """The trainer keys that `jepa train ARGS` reads from its command line and `environ` (not None)."""
    from jepa_cli.cli.train import command

    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    params = command.make_context("train", list(args), auto_envvar_prefix="JEPA_TRAIN").params
    return {k: v for k, v in params.items() if k in TRAINER_FLAGS and v is not None}


def test_environment_variables_parse_each_kind(monkeypatch):
    environ = {"JEPA_TRAIN_BATCH_SIZE": "256", "JEPA_TRAIN_LR": "3e-4", "JEPA_TRAIN_BETAS": "0.9, 0.95",
               "JEPA_TRAIN_ASYNC_CHECKPOINTING": "false", "JEPA_TRAIN_MESH": "data=2", "JEPA_TRAIN_SEED": "",
               "HOME": "/root"}
    assert _train_options(monkeypatch, environ) == {"batch_size": 256, "lr": 3e-4, "betas": [0.9, 0.95],
                                                    "async_checkpointing": False, "mesh": "data=2"}


@pytest.mark.parametrize("name,value,message", [
    ("JEPA_TRAIN_BATCH_SIZE", "lots", "JEPA_TRAIN_BATCH_SIZE must be an integer >= 1, got 'lots'"),
    ("JEPA_TRAIN_BATCH_SIZE", "0", "JEPA_TRAIN_BATCH_SIZE must be an integer >= 1, got 0"),
    ("JEPA_TRAIN_ASYNC_CHECKPOINTING", "maybe", "JEPA_TRAIN_ASYNC_CHECKPOINTING must be true or false, got 'maybe'"),
    ("JEPA_TRAIN_OBJECTIVE", "byol", "JEPA_TRAIN_OBJECTIVE must be one of ijepa, vjepa, audio-jepa, flow, diffusion"),
    ("JEPA_TRAIN_BATCHSIZE", "8", "JEPA_TRAIN_BATCHSIZE: `jepa train` has no option --batchsize"),
])
def test_a_bad_environment_variable_is_named(run_cli, name, value, message):
    assert_user_error(run_cli("train", "--data", "x", "-o", "y", env={name: value}), message)


@pytest.mark.slow
def test_layers_recipe_then_environment_then_command_line(tmp_path, monkeypatch):
    recipe = tmp_path / "r.toml"
    recipe.write_text("batch_size = 8\nlr = 0.5\nseed = 3\n")
    environ = {"JEPA_TRAIN_BATCH_SIZE": "16", "JEPA_TRAIN_LR": "0.25"}
    config = resolve_config(_train_options(monkeypatch, environ, "--batch-size", "32"), recipe)
    assert (config.batch_size, config.lr, config.seed, config.wd) == (32, 0.25, 3, TrainConfig.wd)


@pytest.mark.slow
def test_choices_are_refused_before_jax_is_imported():
    code = ("import sys; from jepa_cli.cli.main import cli\n"
            "try:\n    cli.main(['train', '--model', 'enormous', '--data', 'x', '-o', 'y'])\nexcept SystemExit as e:\n"
            "    print(e.code)\n"
            "heavy = sorted(m for m in ('jax', 'tensorstore', 'flax') if m in sys.modules)\n"
            "assert not heavy, heavy")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2"
    assert result.stderr.strip().splitlines() == [
        "jepa: error: --model must be one of tiny, small, base, large, huge, giant, got 'enormous'"]


def test_a_bad_betas_option_is_one_line(run_cli):
    assert_user_error(run_cli("train", "--betas", "0.9", "--data", "x", "-o", "y"),
                      "--betas must be two numbers in [0, 1) such as 0.9,0.999, got '0.9'")


def test_plain_progress_lines_at_each_tenth_when_stderr_is_not_a_terminal(capsys, monkeypatch):
    from jepa_cli.cli.common import ProgressHandle, progress_bar

    monkeypatch.setattr(ProgressHandle, "PLAIN_AFTER_S", 0.0)  # lines from the start (10 s by default)
    with progress_bar("encoding", 20, "images") as advance:
        for _ in range(20):
            advance(1)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(",")[0] for line in lines] == [f"encoding: {n}/20 images" for n in range(2, 21, 2)]
    assert lines[-1].endswith("ETA 0s")


def test_a_short_command_writes_no_progress_line(capsys):
    from jepa_cli.cli.common import progress_bar

    with progress_bar("encoding", 20, "images") as advance:
        for _ in range(20):
            advance(1)
    assert capsys.readouterr().err == ""


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from click.testing import CliRunner

    from jepa_cli.cli.main import cli

    path = tmp_path_factory.mktemp("cfg") / "digits.zarr"
    r = CliRunner().invoke(cli, ["ingest", "builtin:digits", str(path), "--size", "16x16", "--channels", "1", "-q"])
    assert r.exit_code == 0, r.stderr
    return path


@pytest.mark.slow
def test_environment_sits_between_the_recipe_and_the_command_line(run_cli, digits, tmp_path):
    import tomllib

    recipe = tmp_path / "r.toml"
    recipe.write_text("batch_size = 8\nlr = 0.5\n[ijepa]\npred_depth = 2\nmodel = \"small\"\n")
    env = {"JEPA_TRAIN_BATCH_SIZE": "16", "JEPA_TRAIN_PRED_DEPTH": "3", "JEPA_TRAIN_LR": "0.25"}
    base = ["train", "--config", recipe, "--data", digits, "-o", tmp_path / "run", "--steps", "5", "--print-config"]
    r = run_cli(*base, "--batch-size", "32", "--model", "tiny", env=env)
    assert r.exit_code == 0, r.stderr
    printed = tomllib.loads(r.stdout)
    assert (printed["batch_size"], printed["lr"], printed["ijepa"]["pred_depth"], printed["ijepa"]["model"]) == (
        32, 0.25, 3, "tiny")
    r = run_cli(*base, env={**env, "JEPA_TRAIN_PRED_DEPTH": "many"})
    assert_user_error(r, "JEPA_TRAIN_PRED_DEPTH must be an integer, got 'many'")
    r = run_cli(*base, env={**env, "JEPA_TRAIN_PRED_SCALE": "1"})
    assert_user_error(r, "JEPA_TRAIN_PRED_SCALE must be two numbers such as 0.15,0.2, got '1'")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_an_unsupported_url_is_refused_not_made_a_local_folder(run_cli, digits, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run_cli("train", "--data", digits, "-o", "http://host/run", "--steps", "1")
    assert_user_error(r, "http://host/run: unsupported scheme http://")
    assert list(tmp_path.iterdir()) == []


def test_a_builtin_recipe_is_read_from_the_package_and_an_unknown_one_is_named():
    assert load_toml("builtin:ijepa-digits-tiny")["steps"] == 500
    with pytest.raises(InputError, match="builtin:nope: no such built-in recipe .known: builtin:audio-jepa-as2m, "):
        load_toml("builtin:nope")


# --- the objectives' options: declared once, as fields of their config dataclasses (jepa_cli/options.py) ---


def _train_option_names() -> set[str]:
    from jepa_cli.cli.train import command

    return {param.name for param in command.params}


def test_every_flagged_objective_field_is_a_train_option_and_no_other_objective_option_exists():
    import dataclasses

    from jepa_cli.masks.config import MultiBlockConfig
    from jepa_cli.objectives.genconfig import GenerativeConfig
    from jepa_cli.objectives.ijepa_config import IJEPAConfig
    from jepa_cli.objectives.lejepa_config import LeJEPAConfig

    flagged = {f.name for cls in (IJEPAConfig, MultiBlockConfig, GenerativeConfig, LeJEPAConfig)
               for f in dataclasses.fields(cls)
               if f.metadata.get("flag")}
    command_only = {"config_path", "print_config", "resume", "force", "coordinator", "num_processes", "process_id",
                    "as_json", "verbose", "quiet", "allow_new_data"}
    trainer_keys = set(TRAINER_FLAGS)
    assert _train_option_names() - trainer_keys - command_only == flagged
    # 32 + var_weight, var_target, cov_weight, mixer, pred_mixer, ssm_state, ssm_step, scan_order, ssm_gaps, edm_*,
    # attention_impl, ema and the options added beside them (sigreg_on among them), and LeJEPA's views, crops,
    # clip windows and projector
    assert len(flagged) == 57


def test_an_objective_option_help_comes_from_its_field_with_the_default(run_cli):
    text = " ".join(run_cli("train", "--help").stdout.split())
    assert "--pred-depth INTEGER Predictor depth (blocks). [ijepa; default 6]" in text
    assert "--pred-scale LO,HI Target block scale LO,HI (fraction of the grid). [ijepa; default 0.15,0.2]" in text
    assert "--image-size HXW Training crop size, S or HxW (default in jepa train: the dataset's). [ijepa; default 224]" in text
    assert "--schedule [cosine|edm]" in text and "[diffusion; default cosine]" in text


def test_every_option_field_has_a_help_sentence():
    import dataclasses

    from jepa_cli.masks.config import MultiBlock3DConfig, MultiBlockConfig, RandomConfig
    from jepa_cli.objectives.genconfig import GenerativeConfig
    from jepa_cli.objectives.ijepa_config import IJEPAConfig
    from jepa_cli.objectives.vjepa import VJEPAConfig

    for cls in (IJEPAConfig, VJEPAConfig, MultiBlockConfig, MultiBlock3DConfig, RandomConfig, GenerativeConfig):
        for field in dataclasses.fields(cls):
            if field.name == "mask_options":  # the masks' own fields, held as pairs
                continue
            assert field.metadata.get("help", "").endswith((".", ")")), (cls.__name__, field.name)


@pytest.mark.slow
def test_a_switch_on_the_command_line_overrides_a_recipe_that_turned_it_on(run_cli, digits, tmp_path):
    import tomllib

    recipe = tmp_path / "r.toml"
    recipe.write_text("[ijepa]\nofficial_positions = true\nscan_layers = true\n")
    base = ["train", "--config", recipe, "--data", digits, "-o", tmp_path / "run", "--steps", "1", "--print-config"]
    printed = tomllib.loads(run_cli(*base, "--no-official-positions").stdout)["ijepa"]
    assert (printed["mask_options"]["official_positions"], printed["scan_layers"]) == (False, True)
    printed = tomllib.loads(run_cli(*base, env={"JEPA_TRAIN_SCAN_LAYERS": "false"}).stdout)["ijepa"]
    assert (printed["mask_options"]["official_positions"], printed["scan_layers"]) == (True, False)


@pytest.mark.slow
def test_a_size_option_takes_s_or_hxw_and_names_itself_when_wrong(run_cli, digits, tmp_path):
    import tomllib

    base = ["train", "--data", digits, "-o", tmp_path / "run", "--steps", "1", "--print-config", "--patch-size", "4"]
    assert tomllib.loads(run_cli(*base, "--image-size", "8x12").stdout)["ijepa"]["image_size"] == [8, 12]
    assert tomllib.loads(run_cli(*base, "--image-size", "12x12").stdout)["ijepa"]["image_size"] == 12
    assert_user_error(run_cli(*base, "--image-size", "12by12"),
                      "--image-size must be positive S or HxW such as 224 or 224x320, got '12by12'")


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["--image-size", "0"], "--image-size must be positive S or HxW such as 224 or 224x320, got '0'"),
    (["--image-size", "16x0"], "got '16x0'"),
    (["--pred-width", "0"], "pred_width must be positive, got 0"),
    (["--config", "{recipe}"], "depth must be positive, got -2"),
], ids=["zero-size", "zero-width-size", "zero-predictor-width", "negative-depth-in-a-recipe"])
def test_a_non_positive_model_size_is_one_line_and_writes_nothing(run_cli, digits, tmp_path, args, message):
    recipe = tmp_path / "r.toml"
    recipe.write_text("[ijepa]\ndepth = -2\n")
    run = tmp_path / "run"
    r = run_cli("train", "--data", digits, "-o", run, "--steps", "1", "--patch-size", "2",
                *[a.format(recipe=recipe) for a in args])
    assert_user_error(r, message)
    assert not run.exists()


def _toy_images(path):
    import numpy as np

    from jepa_cli.data import store

    store.write_group(path, store.base_attributes("dataset", modality="image", layout="NHWC", class_names=[]))
    store.write_array(path / "inputs", np.random.default_rng(0).integers(0, 256, (32, 8, 8, 1), dtype=np.uint8))
    return path


TOY_RUN = ["train", "--objective", "toy_objective:make", "--mesh", "data=1", "--batch-size", "16"]


@pytest.mark.slow
def test_a_warmup_as_long_as_the_run_is_warned_naming_both_and_kept(run_cli, tmp_path):
    data, run = _toy_images(tmp_path / "toy.zarr"), tmp_path / "run"
    r = run_cli(*TOY_RUN, "--data", data, "--out", run, "--steps", "3", "--warmup-steps", "3", "--json")
    assert r.exit_code == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("jepa: warning: warmup")]
    assert warnings == ["jepa: warning: warmup_steps 3 is not shorter than the run's 3 updates: the learning rate "
                        "never reaches lr; set --warmup-steps (e.g. 1)"]
    assert json.loads((run / "run.json").read_text())["lengths"]["warmup_steps"] == 3


@pytest.mark.slow
def test_a_warmup_shorter_than_the_run_or_a_run_of_no_update_is_not_warned(run_cli, tmp_path):
    data = _toy_images(tmp_path / "toy.zarr")
    for steps, warmup in (("3", "2"), ("0", "200")):
        r = run_cli(*TOY_RUN, "--data", data, "--out", tmp_path / f"run{steps}", "--steps", steps,
                    "--warmup-steps", warmup, "--json")
        assert r.exit_code == 0, r.stderr
        assert "warmup_steps" not in r.stderr


def test_the_warmup_warning_suggests_the_default_share_of_the_run():
    from jepa_cli.training.config import warmup_warning

    assert warmup_warning({"steps": 150, "warmup_steps": 200}) == (
        "warmup_steps 200 is not shorter than the run's 150 updates: the learning rate never reaches lr; "
        "set --warmup-steps (e.g. 20)")
    assert warmup_warning({"steps": 150, "warmup_steps": 149}) is None


@pytest.mark.slow
def test_a_run_of_no_update_draws_no_progress_bar_on_a_terminal(run_cli, tmp_path, monkeypatch):
    from rich.console import Console

    from jepa_cli.cli import common

    monkeypatch.setattr(common, "stderr_console", lambda quiet=False: Console(stderr=True, quiet=quiet,
                                                                               force_terminal=True, width=100))
    data = _toy_images(tmp_path / "toy.zarr")
    r = run_cli(*TOY_RUN, "--data", data, "--out", tmp_path / "run", "--steps", "0", "--json")
    assert r.exit_code == 0, r.stderr
    assert "0/0" not in r.stderr  # the bar's count
    assert json.loads(r.stdout)["step"] == 0


def test_print_config_notes_a_warmup_as_long_as_the_run_beside_the_key():
    from jepa_cli.training.config import build_config, length_notes, to_toml

    text = to_toml(build_config({"steps": 150, "warmup_steps": 200}),
                   {None: length_notes({"steps": 150, "warmup_steps": 200})})
    assert "warmup_steps = 200  # warmup_steps 200 is not shorter than the run's 150 updates" in text
    assert tomllib.loads(text)["warmup_steps"] == 200  # the comment keeps the recipe readable
    assert length_notes({"steps": 150, "warmup_steps": 20}) == {}
