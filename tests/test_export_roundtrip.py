"""`jepa export` and `jepa import-checkpoint` as a round trip: an export reads back with no options
(the model's geometry travels in the file, under a key the official loaders ignore), a one-encoder
export reads back as an encoder-only run, a run the official classes are not built for is refused
at export, and `--print-snippet` prints the PyTorch hand-off at the run's own size."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_user_error
from test_encode import image_dataset
from test_import_checkpoint_families import audio_dataset, video_dataset

pytestmark = pytest.mark.slow

# tiny models at step 0; the I-JEPA run's normalisation is its own, so that the snippet's is told apart
RECIPES = {
    "ijepa": 'objective = "ijepa"\n[ijepa]\nmodel = "tiny"\nwidth = 16\ndepth = 1\nheads = 2\npatch_size = 4\n'
             'image_size = 32\npred_width = 8\npred_depth = 1\npred_heads = 2\nmean = [0.25, 0.5, 0.75]\n'
             'std = [0.125, 0.25, 0.5]\n',
    "vjepa": 'objective = "vjepa"\n[vjepa]\nmodel = "tiny"\nwidth = 16\ndepth = 1\nheads = 2\npatch_size = 4\n'
             'pred_width = 8\npred_depth = 1\npred_heads = 2\n',
    # frames x mel bins need not be square for the official Audio-JEPA class (input_size is a pair)
    "audio-jepa": 'objective = "audio-jepa"\n["audio-jepa"]\nmodel = "tiny"\nwidth = 16\ndepth = 1\nheads = 2\n'
                  'patch_size = 4\npred_width = 8\npred_depth = 1\npred_heads = 2\nframes = 32\nmel_bins = 16\n',
}
ALL = {"ijepa": "all.pth.tar", "vjepa": "all.pth.tar", "audio-jepa": "all.ckpt"}


def _cli(*args):
    from click.testing import CliRunner

    from jepa_cli.cli.main import cli

    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False, prog_name="jepa")


def _train(root: Path, objective: str, recipe: str, data: Path) -> Path:
    (root / "r.toml").write_text(recipe)
    result = _cli("train", "--config", root / "r.toml", "--data", data, "--out", root / "run", "--steps", "0",
                  "--batch-size", "4", "--mesh", "data=1", "-q")
    assert result.exit_code == 0, result.stderr
    return root / "run"


def _data(root: Path, objective: str, **kw) -> Path:
    if objective == "ijepa":
        return image_dataset(root / "d.zarr", n=8, size=32, channels=3)
    if objective == "vjepa":
        return video_dataset(root / "d.zarr", frames=kw.get("frames", 4), size=kw.get("size", 16))
    return audio_dataset(root / "d.zarr", 4, 8000, 0.5)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """objective -> a tiny run of it at step 0 (its context and target encoders are the same weights)."""
    out = {}
    for objective, recipe in RECIPES.items():
        root = tmp_path_factory.mktemp(objective)
        out[objective] = _train(root, objective, recipe, _data(root, objective))
    return out


@pytest.fixture(scope="module")
def exports(runs, tmp_path_factory):
    """(objective, kind) -> the run's export: 'all' (the trainer's checkpoint), 'all.safetensors',
    'one' (the target encoder alone, .pth.tar or .ckpt) and 'one.safetensors'."""
    root = tmp_path_factory.mktemp("exports")
    out = {}
    for objective, run in runs.items():
        suffix = ALL[objective].removeprefix("all")
        for kind, name, extra in (("all", f"all{suffix}", ["--all"]), ("all.safetensors", "all.safetensors", ["--all"]),
                                  ("one", f"one{suffix}", []), ("one.safetensors", "one.safetensors", [])):
            path = root / f"{objective}-{name}"
            result = _cli("export", run, "-o", path, *extra, "-q")
            assert result.exit_code == 0, result.stderr
            out[objective, kind] = path
    return out


def _flat(tree):
    import jax

    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _weights(run):
    from jepa_cli.training.run import load_run

    return load_run(run)[2]


def _model(run):
    return json.loads((Path(run) / "run.json").read_text())["config"]["objective_config"]


GEOMETRY = ("width", "depth", "heads", "patch_size", "image_size", "channels", "pred_width", "pred_depth",
            "pred_heads", "num_frames", "tubelet_size", "frames", "mel_bins")


# -- geometries the official classes are not built for -------------------------------------------------

@pytest.mark.parametrize("objective, change, fragments", [
    ("ijepa", "image_size = [32, 16]\n", ["32x16", "image_size", "square"]),
    ("vjepa", "image_size = [32, 16]\n", ["32x16", "image_size", "square"]),
    ("vjepa", "tubelet_size = 1\n", ["1 frame", "num_frames"]),
], ids=["ijepa-non-square", "vjepa-non-square", "vjepa-one-frame"])
def test_a_run_the_official_class_cannot_be_built_for_is_refused_at_export(tmp_path, objective, change, fragments,
                                                                          run_cli):
    data = _data(tmp_path, objective, frames=1) if "tubelet" in change else _data(tmp_path, objective, size=32)
    run = _train(tmp_path, objective, RECIPES[objective].replace("image_size = 32\n", "") + change, data)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_user_error(run_cli("export", run, "-o", tmp_path / "out.pth.tar", "--all"), str(run), *fragments)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


# -- the round trip without options ----------------------------------------------------------------

@pytest.mark.parametrize("objective", list(RECIPES))
@pytest.mark.parametrize("kind", ["all", "all.safetensors"])
def test_an_all_export_imports_back_without_options_bit_for_bit(runs, exports, tmp_path, objective, kind):
    result = _cli("import-checkpoint", exports[objective, kind], "-o", tmp_path / "back", "-q")
    assert result.exit_code == 0, result.stderr
    before, after = _flat(_weights(runs[objective])), _flat(_weights(tmp_path / "back"))
    assert sorted(before) == sorted(after)
    for name, value in before.items():
        assert after[name].dtype == value.dtype and np.array_equal(after[name], value), name
    want, got = _model(runs[objective]), _model(tmp_path / "back")
    assert {k: got.get(k) for k in GEOMETRY if k in want} == {k: want[k] for k in GEOMETRY if k in want}


def test_an_option_given_wins_over_the_recorded_geometry(exports, tmp_path):
    # the recorded heads are 2; the width of 16 takes 4 as well
    result = _cli("import-checkpoint", exports["ijepa", "all"], "-o", tmp_path / "back", "--heads", "4", "-q")
    assert result.exit_code == 0, result.stderr
    assert _model(tmp_path / "back")["heads"] == 4


def _without_record(source: Path, path: Path) -> Path:
    from jepa_cli.models.torch_checkpoint import read_torch_checkpoint
    from jepa_cli.models.torch_writer import torch_checkpoint_bytes

    checkpoint = read_torch_checkpoint(source)
    del checkpoint["jepa_model"]
    path.write_bytes(torch_checkpoint_bytes(checkpoint))
    return path


@pytest.mark.parametrize("objective, fragment, flags", [
    ("ijepa", "the chosen model's is [1280]", ["--model", "tiny", "--width", "16", "--depth", "1", "--heads", "2",
                                               "--patch-size", "4", "--image-size", "32", "--pred-width", "8",
                                               "--pred-depth", "1"]),
    ("vjepa", "give --heads", ["--heads", "2", "--num-frames", "4"]),
])
def test_a_file_without_the_geometry_record_needs_its_options_as_before(exports, tmp_path, objective, fragment,
                                                                        flags, run_cli):
    plain = _without_record(exports[objective, "all"], tmp_path / "official.pth.tar")
    assert_user_error(run_cli("import-checkpoint", plain, "-o", tmp_path / "refused"), str(plain), fragment)
    assert not (tmp_path / "refused").exists()
    result = run_cli("import-checkpoint", plain, "-o", tmp_path / "back", *flags, "-q")
    assert result.exit_code == 0, result.stderr


def test_a_geometry_record_of_the_wrong_type_is_refused_naming_it(exports, tmp_path, run_cli):
    from jepa_cli.models.torch_checkpoint import read_torch_checkpoint
    from jepa_cli.models.torch_writer import torch_checkpoint_bytes

    checkpoint = read_torch_checkpoint(exports["ijepa", "all"])
    checkpoint["jepa_model"]["heads"] = "two"
    (tmp_path / "bad.pth.tar").write_bytes(torch_checkpoint_bytes(checkpoint))
    assert_user_error(run_cli("import-checkpoint", tmp_path / "bad.pth.tar", "-o", tmp_path / "out"),
                      "bad.pth.tar", "jepa_model", "heads")
    assert not (tmp_path / "out").exists()


# -- one encoder -------------------------------------------------------------------------------------

@pytest.mark.parametrize("objective", list(RECIPES))
@pytest.mark.parametrize("kind", ["one", "one.safetensors"])
def test_a_one_encoder_export_imports_as_a_run_of_that_encoder(runs, exports, tmp_path, objective, kind):
    result = _cli("import-checkpoint", exports[objective, kind], "-o", tmp_path / "back", "-q")
    assert result.exit_code == 0, result.stderr
    target = _flat(_weights(runs[objective])["ema"])
    back = _weights(tmp_path / "back")
    for tree in (back["ema"], back["params"]["encoder"]):  # the one encoder is read as both
        got = _flat(tree)
        assert sorted(got) == sorted(target)
        assert all(np.array_equal(got[k], v) for k, v in target.items())
    assert json.loads((tmp_path / "back" / "run.json").read_text())["imported"]["parts"] == ["target_encoder"]


@pytest.fixture(scope="module")
def encoder_only(exports, tmp_path_factory):
    run = tmp_path_factory.mktemp("encoder-only") / "run"
    result = _cli("import-checkpoint", exports["ijepa", "one"], "-o", run, "-q")
    assert result.exit_code == 0, result.stderr
    return run


def test_an_encoder_only_run_encodes_as_the_run_it_was_exported_from(runs, encoder_only, tmp_path):
    from conftest import read_zarr

    data = image_dataset(tmp_path / "d.zarr", n=4, size=32, channels=3)
    for name, run in (("a", runs["ijepa"]), ("b", encoder_only)):
        result = _cli("encode-latents", run, data, "-o", tmp_path / f"{name}.zarr", "-q")
        assert result.exit_code == 0, result.stderr
    assert np.array_equal(read_zarr(tmp_path / "a.zarr" / "inputs"), read_zarr(tmp_path / "b.zarr" / "inputs"))


def test_an_encoder_only_run_loads_in_the_python_api(runs, encoder_only):
    import jepa_cli.api as jepa

    x = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3)).astype(np.uint8)
    assert np.array_equal(jepa.load_run(encoder_only).encode(x), jepa.load_run(runs["ijepa"]).encode(x))


def test_resuming_an_encoder_only_run_is_refused_in_one_line(encoder_only, tmp_path, run_cli):
    data = image_dataset(tmp_path / "d.zarr", n=8, size=32, channels=3)
    before = sorted(p.name for p in encoder_only.rglob("*"))
    assert_user_error(run_cli("train", "--out", encoder_only, "--data", data, "--resume", "--steps", "1"),
                      str(encoder_only), "encoder-only", "no predictor", "optimizer")
    assert sorted(p.name for p in encoder_only.rglob("*")) == before


# -- the PyTorch hand-off ------------------------------------------------------------------------------

def _constructor(text: str) -> dict:
    """The keyword arguments of the snippet's VisionTransformer(...) call, as literals."""
    calls = [node for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Call)
             and getattr(node.func, "id", None) == "VisionTransformer"]
    assert len(calls) == 1
    return {k.arg: ast.literal_eval(k.value) for k in calls[0].keywords if k.arg != "norm_layer"}


def _assigned(text: str, name: str):
    """The list literal inside `name = torch.tensor([...])...` of the snippet."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            call = node.value.func.value  # torch.tensor([...]).view(...)
            return ast.literal_eval(call.args[0])
    raise AssertionError(f"no {name} = in the snippet")


@pytest.mark.parametrize("objective", list(RECIPES))
def test_the_snippet_builds_the_official_class_at_the_runs_size(runs, objective, run_cli):
    run = runs[objective]
    before = sorted(p.name for p in run.parent.rglob("*"))
    result = run_cli("export", run, "--print-snippet")
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in run.parent.rglob("*")) == before
    model = _model(run)
    got = _constructor(result.stdout)
    common = {"embed_dim": model["width"], "depth": model["depth"], "num_heads": model["heads"], "mlp_ratio": 4.0}
    if objective == "ijepa":
        want = {**common, "img_size": [model["image_size"]], "patch_size": model["patch_size"],
                "in_chans": model["channels"], "qkv_bias": True}
    elif objective == "vjepa":
        want = {**common, "img_size": model["image_size"], "patch_size": model["patch_size"],
                "num_frames": model["num_frames"], "tubelet_size": model["tubelet_size"],
                "in_chans": model["channels"], "qkv_bias": True, "uniform_power": True}
    else:
        want = {**common, "input_size": (32, 16), "patch_size": (4, 4), "in_chans": 1, "qkv_bias": True,
                "use_flash_attn": False}
    assert got == want
    assert "strict=True" in result.stdout


def test_the_snippet_normalises_with_the_runs_mean_and_std(runs, run_cli):
    text = run_cli("export", runs["ijepa"], "--print-snippet").stdout
    assert (_assigned(text, "mean"), _assigned(text, "std")) == ([0.25, 0.5, 0.75], [0.125, 0.25, 0.5])
