"""`jepa export RUN -o FILE`: a run's weights in the official layout of its family (I-JEPA here; V-JEPA
and Audio-JEPA runs of `jepa train` at the end, their imported official checkpoints in
test_import_checkpoint_families.py), as a PyTorch checkpoint (written without torch) or safetensors;
`jepa import-checkpoint` reads it back to the same weights.

tests/data/official_ijepa_tiny.pth.tar was written by real `torch.save` in the official layout
(tests/data/make_official_checkpoint.py); a run imported from it, exported again, must give its
tensors back, `pos_embed` included.
"""

from __future__ import annotations

import json
import pickletools
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_user_error
from test_encode import image_dataset

DATA = Path(__file__).parent / "data"
OFFICIAL = DATA / "official_ijepa_tiny.pth.tar"
RECIPE = Path(__file__).resolve().parents[1] / "jepa_cli" / "recipes" / "ijepa-digits-tiny.toml"
# the official tiny model: ViT width 64, depth 2, 4 heads, patch 4, 32 px; predictor 32 x 2
TINY = ["--model", "tiny", "--width", "64", "--depth", "2", "--heads", "4", "--patch-size", "4", "--image-size", "32",
        "--pred-width", "32", "--pred-depth", "2", "--pred-heads", "4", "--ipe", "10", "--epochs", "20"]


def _cli(*args):
    from click.testing import CliRunner

    from jepa_cli.cli.main import cli

    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """A run imported from the official checkpoint: its context and target encoders differ."""
    run = tmp_path_factory.mktemp("imported") / "run"
    result = _cli("import-checkpoint", OFFICIAL, "-o", run, *TINY, "-q")
    assert result.exit_code == 0, result.stderr
    return run


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run of the tiny recipe written by `jepa train` (step 0, 16 px RGB, 4 blocks)."""
    root = tmp_path_factory.mktemp("trained")
    data = image_dataset(root / "data.zarr", n=16, size=16, channels=3)
    result = _cli("train", "--config", RECIPE, "--data", data, "--out", root / "run", "--steps", "0", "--batch-size",
                  "8", "--mesh", "data=1", "-q")
    assert result.exit_code == 0, result.stderr
    return root / "run"


def _read(path):
    from jepa_cli.models.torch_checkpoint import read_torch_checkpoint

    return read_torch_checkpoint(path)


def _flat(tree):
    import jax

    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.mark.slow
def test_an_exported_run_imports_back_to_the_same_weights_bit_for_bit(trained, tmp_path):
    from jepa_cli.training.run import load_run

    assert _cli("export", trained, "-o", tmp_path / "run.pth.tar", "--all", "-q").exit_code == 0
    model = json.loads((trained / "run.json").read_text())["config"]["objective_config"]
    flags = ["--model", model["model"], "--width", model["width"], "--depth", model["depth"], "--heads", model["heads"],
             "--patch-size", model["patch_size"], "--image-size", model["image_size"], "--pred-width",
             model["pred_width"], "--pred-depth", model["pred_depth"], "--ipe", "2"]
    result = _cli("import-checkpoint", tmp_path / "run.pth.tar", "-o", tmp_path / "back", *flags, "-q")
    assert result.exit_code == 0, result.stderr
    _, _, before, _ = load_run(trained)
    _, _, after, _ = load_run(tmp_path / "back")
    before, after = _flat(before), _flat(after)
    assert sorted(before) == sorted(after) and len(before) == 52 + 55 + 52  # encoder, predictor, ema
    for name, value in before.items():
        assert after[name].dtype == value.dtype and np.array_equal(after[name], value), name


@pytest.mark.slow
def test_the_export_of_an_imported_official_checkpoint_holds_its_tensors(imported, tmp_path):
    assert _cli("export", imported, "-o", tmp_path / "again.pth.tar", "--all", "-q").exit_code == 0
    official, exported = _read(OFFICIAL), _read(tmp_path / "again.pth.tar")
    assert sorted(exported) == ["encoder", "epoch", "jepa_model", "predictor", "target_encoder"]
    assert exported["epoch"] == 3  # step 30 of 10 iterations per epoch
    for part in ("encoder", "predictor", "target_encoder"):
        assert sorted(exported[part]) == sorted(official[part])  # module.-prefixed, pos_embed tables included
        for name, value in official[part].items():
            assert np.array_equal(exported[part][name], value), (part, name)


@pytest.mark.slow
def test_the_epoch_written_counts_whole_epochs_of_a_step_between_two(imported, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(imported, run)
    record = json.loads((run / "run.json").read_text())
    record["lengths"]["ipe"] = 7
    (run / "run.json").write_text(json.dumps(record))
    assert _cli("export", run, "-o", tmp_path / "x.pth.tar", "-q").exit_code == 0
    assert _read(tmp_path / "x.pth.tar")["epoch"] == 4  # step 30 at 7 updates an epoch: 4 whole epochs (28), 2 more


@pytest.mark.slow
def test_one_encoder_is_written_under_the_official_key_of_its_weights(imported, tmp_path):
    official = _read(OFFICIAL)
    _cli("export", imported, "-o", tmp_path / "target.pth.tar", "-q")
    _cli("export", imported, "-o", tmp_path / "context.pth.tar", "--weights", "context", "-q")
    target, context = _read(tmp_path / "target.pth.tar"), _read(tmp_path / "context.pth.tar")
    assert sorted(target) == ["epoch", "jepa_model", "target_encoder"]
    assert sorted(context) == ["encoder", "epoch", "jepa_model"]
    name = "module.blocks.0.attn.qkv.weight"
    assert np.array_equal(target["target_encoder"][name], official["target_encoder"][name])
    assert np.array_equal(context["encoder"][name], official["encoder"][name])
    assert not np.array_equal(official["encoder"][name], official["target_encoder"][name])


@pytest.mark.slow
def test_safetensors_holds_one_encoder_under_bare_official_names(imported, tmp_path):
    from safetensors import safe_open
    from safetensors.numpy import load_file

    result = _cli("export", imported, "-o", tmp_path / "enc.safetensors", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["parts"] == ["target_encoder"]
    tensors = load_file(tmp_path / "enc.safetensors")
    official = {k.removeprefix("module."): v for k, v in _read(OFFICIAL)["target_encoder"].items()}
    assert sorted(tensors) == sorted(official) and "pos_embed" in tensors
    assert all(np.array_equal(tensors[k], official[k]) for k in official)
    with safe_open(tmp_path / "enc.safetensors", "np") as f:
        meta = f.metadata()
    assert (meta["objective"], meta["step"], meta["epoch"], meta["parts"]) == ("ijepa", "30", "3", "target_encoder")


@pytest.mark.slow
def test_safetensors_with_all_prefixes_each_name_with_its_part(imported, tmp_path):
    from safetensors.numpy import load_file

    _cli("export", imported, "-o", tmp_path / "all.safetensors", "--all", "-q")
    tensors = load_file(tmp_path / "all.safetensors")
    official = _read(OFFICIAL)
    assert len(tensors) == sum(len(official[p]) for p in ("encoder", "predictor", "target_encoder")) == 90
    assert np.array_equal(tensors["predictor.predictor_blocks.1.mlp.fc2.weight"],
                          official["predictor"]["module.predictor_blocks.1.mlp.fc2.weight"])


@pytest.mark.slow
def test_the_pickle_names_only_what_torch_load_weights_only_allows(imported, tmp_path):
    _cli("export", imported, "-o", tmp_path / "x.pth.tar", "--all", "-q")
    with zipfile.ZipFile(tmp_path / "x.pth.tar") as archive:
        names = archive.namelist()
        pickled = archive.read("archive/data.pkl")
        with open(tmp_path / "x.pth.tar", "rb") as raw:  # each storage starts on a 64-byte boundary
            for info in archive.infolist():
                raw.seek(info.header_offset + 26)
                name_len, extra_len = (int(n) for n in np.frombuffer(raw.read(4), "<u2"))
                assert (info.header_offset + 30 + name_len + extra_len) % 64 == 0, info.filename
    assert {"archive/data.pkl", "archive/byteorder", "archive/version", "archive/data/0"} <= set(names)
    globals_ = {arg for op, arg, _ in pickletools.genops(pickled) if op.name == "GLOBAL"}
    assert globals_ == {"collections OrderedDict", "torch._utils _rebuild_tensor_v2", "torch FloatStorage"}
    assert pickled[:2] == b"\x80\x02"  # protocol 2


@pytest.mark.slow
def test_the_writer_keeps_plain_values_and_every_storage_dtype(tmp_path):
    import collections

    import ml_dtypes

    from jepa_cli.models.torch_writer import torch_checkpoint_bytes

    obj = {"t": collections.OrderedDict(a=np.arange(6, dtype=np.float32).reshape(2, 3).T,
                                        b=np.arange(3, dtype=ml_dtypes.bfloat16), c=np.zeros((0, 2), np.int64),
                                        d=np.array([True, False])),
           "epoch": 2**40, "neg": -70000, "lr": 0.5, "none": None, "list": [1, "x", (2, 3)]}
    (tmp_path / "t.pth").write_bytes(torch_checkpoint_bytes(obj))
    back = _read(tmp_path / "t.pth")
    assert {k: back[k] for k in ("epoch", "neg", "lr", "none", "list")} == \
        {"epoch": 2**40, "neg": -70000, "lr": 0.5, "none": None, "list": [1, "x", (2, 3)]}
    for name, value in obj["t"].items():
        assert back["t"][name].dtype == value.dtype and np.array_equal(back["t"][name], value), name


def test_integers_of_every_width_read_back_through_pythons_own_unpickler():
    import io
    import pickle

    from jepa_cli.models.torch_writer import torch_checkpoint_bytes

    # beyond 32 bits each integer is a LONG1 of bit_length // 8 + 1 bytes (two's complement, a sign bit)
    values = [255, 256, 65535, 65536, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**47 - 1, 2**47, 2**48, -2**47,
              -2**47 - 1, 2**55, 2**63 - 1, 2**63, -2**63, 2**64]
    with zipfile.ZipFile(io.BytesIO(torch_checkpoint_bytes({"values": values}))) as archive:
        assert pickle.loads(archive.read("archive/data.pkl")) == {"values": values}


@pytest.mark.slow
@pytest.mark.parametrize("case", ["exists", "no-run", "not-a-run", "suffix", "weights-and-all", "other-objective"])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(imported, tmp_path, case, run_cli):
    out = tmp_path / "out.pth.tar"
    run, extra = imported, []
    if case == "exists":
        out.write_bytes(b"a user's file")
    elif case == "no-run":
        run = tmp_path / "missing"
    elif case == "not-a-run":
        run = image_dataset(tmp_path / "data.zarr", n=2, size=8)
    elif case == "suffix":
        out = tmp_path / "out.bin"
    elif case == "weights-and-all":
        extra = ["--all", "--weights", "context"]
    elif case == "other-objective":
        run = tmp_path / "flow-run"
        run.mkdir()
        (run / "run.json").write_text(json.dumps({"config": {"objective": "flow"}, "lengths": {}}))
    before = sorted(p.name for p in tmp_path.iterdir())
    result = run_cli("export", run, "-o", out, *extra)
    fragment = {"exists": "already exists", "no-run": "no such run", "not-a-run": "not a training run",
                "suffix": ".safetensors", "weights-and-all": "--all", "other-objective": "'flow'"}[case]
    assert_user_error(result, fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no partial file left either
    if case == "exists":
        assert out.read_bytes() == b"a user's file"



# -- V-JEPA and Audio-JEPA runs written by `jepa train` ------------------------------------------------------
# tiny models at step 0 (the initialisation); each family's recipe table
TRAINED = {"vjepa": 'objective = "vjepa"\n[vjepa]\nwidth = 16\ndepth = 1\nheads = 2\npatch_size = 4\npred_width = 8\n'
                    'pred_depth = 1\npred_heads = 2\n',
           "audio-jepa": 'objective = "audio-jepa"\n["audio-jepa"]\nmodel = "tiny"\nwidth = 16\ndepth = 1\nheads = 2\n'
                         'patch_size = 4\npred_width = 8\npred_depth = 1\npred_heads = 2\nframes = 16\nmel_bins = 16\n'}


def _train_step0(root: Path, objective: str, extra: str = "") -> Path:
    from test_import_checkpoint_families import audio_dataset, video_dataset

    data = video_dataset(root / "d.zarr") if objective == "vjepa" else audio_dataset(root / "d.zarr", 4, 8000, 0.5)
    (root / "r.toml").write_text(TRAINED[objective] + extra)
    result = _cli("train", "--config", root / "r.toml", "--data", data, "--out", root / "run", "--steps", "0",
                  "--batch-size", "4", "--mesh", "data=1", "-q")
    assert result.exit_code == 0, result.stderr
    return root / "run"


@pytest.mark.slow  # trains two runs
@pytest.mark.parametrize("objective, flags", [("vjepa", ["--heads", "2", "--pred-heads", "2", "--num-frames", "4"]),
                                              ("audio-jepa", ["--heads", "2", "--pred-heads", "2", "--mel-bins", "16"])])
def test_a_trained_vjepa_or_audio_run_imports_back_from_its_export_bit_for_bit(tmp_path, objective, flags):
    from jepa_cli.training.run import load_run

    run = _train_step0(tmp_path, objective)
    assert _cli("export", run, "-o", tmp_path / "run.pth.tar", "--all", "-q").exit_code == 0
    result = _cli("import-checkpoint", tmp_path / "run.pth.tar", "-o", tmp_path / "back", *flags, "-q")
    assert result.exit_code == 0, result.stderr
    before, after = _flat(load_run(run)[2]), _flat(load_run(tmp_path / "back")[2])
    assert sorted(before) == sorted(after)
    for name, value in before.items():
        assert after[name].dtype == value.dtype and np.array_equal(after[name], value), name


@pytest.mark.slow  # trains a run
def test_a_run_whose_norm_eps_is_not_the_official_one_is_refused(tmp_path, run_cli):
    run = _train_step0(tmp_path, "audio-jepa", "norm_eps = 1e-6\n")
    assert_user_error(run_cli("export", run, "-o", tmp_path / "out.ckpt"), "norm_eps", "1e-06", "1e-05")
    assert not (tmp_path / "out.ckpt").exists()
