"""`jepa mask`: the mask file, --show, --png (also over a dataset), --stats/--json, `jepa info`, bad input;
the drawings of `jepa mask --show` and `jepa ema-inspect` without colour."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import assert_user_error
from jepa_cli.data import store
from jepa_cli.masks.io import read_masks

# one configuration per strategy, reused so that each compiles once
MB = ["--grid", "8x8", "--min-keep", "4", "--context-size", "40", "--batch-size", "6", "--seed", "1"]
MB3D = ["--strategy", "multiblock3d", "--grid", "6x6", "--frames", "2", "--context-size", "72", "--batch-size", "3"]
RND = ["--strategy", "random", "--grid", "4x4", "--batch", "5"]  # --batch: the former name, kept


@pytest.mark.slow
@pytest.mark.parametrize("args, context_shape, targets_shape, frames", [
    (MB, (6, 64), (6, 4, 64), None),
    (MB3D, (3, 2, 72), (3, 2, 72), 2),
    (RND, (5, 16), (5, 1, 16), None),
])
def test_writes_the_mask_file(run_cli, tmp_path, args, context_shape, targets_shape, frames):
    out = tmp_path / "m.zarr"
    result = run_cli("mask", *args, "-o", out, "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    attrs, context, targets = read_masks(out)
    assert context.shape == context_shape and targets.shape == targets_shape
    assert context.dtype == bool and targets.dtype == bool
    assert attrs["jepa_kind"] == "masks" and attrs["strategy"] == summary["strategy"]
    assert attrs["frames"] == frames and attrs["seed"] == int(summary["seed"]) and attrs["jepa_version"]
    assert attrs["grid"] == summary["grid"] and attrs["parameters"] == summary["parameters"]
    # random masks: every context of a batch has one length, so there is no batch-minimum cut to ask for
    assert "context_size" in attrs["parameters"] and ("official_truncation" in attrs["parameters"]) == (args is not RND)
    # the file holds exactly what was sampled: the counts agree with the summary
    ctx = context.reshape(-1, context.shape[-1]).sum(-1)
    assert ctx.mean() == pytest.approx(summary["context_tokens"]["mean"])
    info = run_cli("info", out, "--json")
    assert info.exit_code == 0, info.stderr
    described = json.loads(info.stdout)
    assert described["kind"] == "masks" and described["context"]["shape"] == list(context_shape)


@pytest.mark.slow
def test_show_stats_and_json(run_cli, tmp_path):
    result = run_cli("mask", *MB, "--show", "--stats", "--samples", "2")
    assert result.exit_code == 0, result.stderr
    assert "legend" in result.stdout and "target 4" in result.stdout and "sample 1" in result.stdout
    assert "context coverage" in result.stdout and "official batch-minimum cut" in result.stdout
    result = run_cli("mask", *MB, "--stats", "--json", "-o", tmp_path / "m.zarr")
    stats = json.loads(result.stdout)["stats"]
    _, context, targets = read_masks(tmp_path / "m.zarr")  # the figures are those of the masks written
    np.testing.assert_allclose(stats["context_coverage"], context.mean(0).reshape(8, 8), atol=5e-5)
    np.testing.assert_allclose(stats["any_target_coverage"], targets.any(1).mean(0).reshape(8, 8), atol=5e-5)
    assert [row["mean"] for row in stats["target_tokens_per_row"]] == pytest.approx(targets.sum(-1).mean(0))
    assert stats["context_tokens"] == {"mean": pytest.approx(context.sum(-1).mean()),
                                       "min": context.sum(-1).min(), "max": context.sum(-1).max()}
    assert stats["official_cut"] == [context.sum(-1).min()] and context.sum(-1).max() <= 40
    shown = run_cli("mask", *MB3D, "--show", "--json")  # with --json the drawing goes to stderr
    assert json.loads(shown.stdout)["frames"] == 2 and "pair 2" in shown.stderr


def test_show_without_colour_draws_the_context_and_each_target_with_its_own_characters(run_cli):
    result = run_cli("mask", *MB, "--show", "--samples", "1")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "legend: ██ context  11 target 1  22 target 2  33 target 3  44 target 4  ·· unused"
    grid = "".join(lines[2:10])
    assert all(cell in grid for cell in ("██", "11", "22", "33", "44"))


def test_stats_print_the_token_counts_once(run_cli):
    result = run_cli("mask", *MB, "--stats")
    assert result.exit_code == 0, result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines() if "tokens" in line] == [
        "context", "target", "target", "target", "target"]


def test_ema_inspect_without_colour_rules_the_past_and_the_future_apart(capsys):
    from jepa_cli.cli.ema_inspect import _human

    schedule = [{"step": s, "momentum": 0.996 + 0.0004 * s} for s in range(11)]
    _human({"run": "runs/a", "step": 4, "total_steps": 10, "momentum": 0.9976, "source": "encoder",
            "init_weight": 0.98, "schedule": schedule, "modules": []})
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "the EMA still holds 0.980 of its initial value (the product of the momenta so far)"
    assert lines[4] == "       │ ━━━━━╌╌╌╌╌╌"
    assert lines[6] == "━━ past / ╌╌ future"


@pytest.mark.slow
def test_png_plain_and_over_a_dataset(run_cli, tmp_path):
    from PIL import Image

    plain = tmp_path / "plain.png"
    assert run_cli("mask", *MB, "--png", plain, "--samples", "3").exit_code == 0
    data = tmp_path / "ds.zarr"
    store.write_group(data, store.base_attributes("dataset", modality="image", layout="NHWC"))
    store.write_array(data / "inputs", np.random.default_rng(0).integers(0, 255, (3, 32, 32, 3), dtype=np.uint8))
    over = tmp_path / "over.png"
    result = run_cli("mask", *MB, "--png", over, "--data", data, "--samples", "2")
    assert result.exit_code == 0, result.stderr
    assert Image.open(plain).size[0] > Image.open(over).size[0] > 0
    video = tmp_path / "video.png"
    assert run_cli("mask", *MB3D, "--png", video).exit_code == 0 and Image.open(video).size[1] > 0


@pytest.mark.slow
def test_force(run_cli, tmp_path):
    out = tmp_path / "m.zarr"
    assert run_cli("mask", *RND, "-o", out).exit_code == 0
    assert_user_error(run_cli("mask", *RND, "-o", out), "already exists")
    assert run_cli("mask", *RND, "--seed", "3", "-o", out, "--force").exit_code == 0
    assert read_masks(out)[0]["seed"] == 3


@pytest.mark.slow
@pytest.mark.parametrize("args, fragment", [
    (["--grid", "2x2", "--npred", "4", "--min-keep", "10"], "cannot hold"),
    (["--pred-scale", "0,0.2"], "(0, 1]"),
    (["--enc-scale", "0.9,1.5"], "(0, 1]"),
    (["--aspect", "1.5,0.75"], "inverted"),
    (["--strategy", "random", "--ratio", "0.6,0.4"], "inverted"),
    (["--frames", "8"], "--frames"),
    (["--strategy", "random", "--frames", "4"], "--frames"),
    (["--strategy", "random", "--npred", "2"], "--npred"),
    (["--grid", "ax3"], "--grid"),
    (["--data", "nowhere.zarr"], "--data"),
])
def test_bad_input_writes_nothing(run_cli, tmp_path, args, fragment):
    out = tmp_path / "m.zarr"
    result = run_cli("mask", *args, "-o", out, "--png", tmp_path / "m.png") if "--data" not in args else \
        run_cli("mask", *args, "-o", out)
    assert_user_error(result, fragment)
    assert list(tmp_path.iterdir()) == []


def test_help_has_summary_and_example(run_cli):
    result = run_cli("mask", "--help")
    assert result.exit_code == 0
    assert "Sample JEPA context/target masks" in result.stdout and "Example:" in result.stdout
    assert "jepa mask --strategy multiblock" in result.stdout
    assert "mask" in run_cli("--help").stdout


def test_cell_labels_mark_context_overlap_targets_and_unused():
    from jepa_cli.masks.render import cell_labels

    context = np.array([[True, True, False, False]])
    targets = np.array([[[False, True, True, False], [False, False, False, False]]])
    [(title, labels)] = cell_labels(None, context, targets, 0)
    assert labels.tolist() == [-2, -3, 0, -1]  # context, context over a target, target block 0, unused


@pytest.mark.slow
def test_png_force_replaces_a_png_but_never_another_file(run_cli, tmp_path):
    notes = tmp_path / "notes.png"
    notes.write_text("my notes, not a picture")
    assert_user_error(run_cli("mask", *MB, "--png", notes, "--force"), "notes.png: is not a PNG picture",
                      "--force replaces only a PNG picture")
    assert notes.read_text() == "my notes, not a picture"
    picture = tmp_path / "m.png"
    assert run_cli("mask", *MB, "--png", picture).exit_code == 0
    assert_user_error(run_cli("mask", *MB, "--png", picture), "m.png: already exists")
    assert run_cli("mask", *MB, "--png", picture, "--force", "--seed", "1").exit_code == 0
    assert picture.read_bytes().startswith(b"\x89PNG") and sorted(p.name for p in tmp_path.iterdir()) == \
        ["m.png", "notes.png"]  # written through a temporary sibling, none left behind


@pytest.mark.slow
def test_write_file_never_replaces_a_file_that_appeared_meanwhile(tmp_path, monkeypatch):
    from jepa_cli.data import atomic
    from jepa_cli.errors import InputError

    target = tmp_path / "m.png"
    real_check = atomic.check_output_file

    def check_then_another_writer(path, force, magic, what):
        checked = real_check(path, force, magic, what)
        target.write_bytes(b"another writer's file")
        return checked

    monkeypatch.setattr(atomic, "check_output_file", check_then_another_writer)
    with pytest.raises(InputError, match="another process wrote it"):
        atomic.write_file(target, atomic.PNG_MAGIC + b"data", False, atomic.PNG_MAGIC, "PNG picture")
    assert target.read_bytes() == b"another writer's file" and [p.name for p in tmp_path.iterdir()] == ["m.png"]


def test_every_field_of_a_strategy_config_is_a_mask_option():
    import dataclasses

    from jepa_cli.cli.mask import command
    from jepa_cli.masks.config import MultiBlock3DConfig, MultiBlockConfig, RandomConfig

    fields = {f.name for cls in (MultiBlockConfig, MultiBlock3DConfig, RandomConfig) for f in dataclasses.fields(cls)}
    assert fields <= {param.name for param in command.params}
    assert len(fields) == 16


def test_the_context_aspect_is_an_option_and_reaches_the_parameters(run_cli):
    result = run_cli("mask", *MB, "--enc-aspect", "0.5,2", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["parameters"]["enc_aspect"] == [0.5, 2.0]
    assert_user_error(run_cli("mask", *MB, "--enc-aspect", "wide"), "--enc-aspect: expected low,high numbers, got 'wide'")
    assert_user_error(run_cli("mask", "--strategy", "random", "--enc-aspect", "1,1"),
                      "--enc-aspect: not an option of --strategy random")
