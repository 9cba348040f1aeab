"""`jepa import-checkpoint` for V-JEPA and Audio-JEPA: the official forward pass on the imported weights.

tests/data/official_vjepa_tiny.pth.tar and official_audio_jepa_tiny.ckpt, and their goldens
tests/data/golden/vjepa_forward.npz and audio_jepa_forward.npz, were written by
scripts/make_import_goldens.py with the official facebookresearch/jepa and LudovicTuncay/Audio-JEPA
models (random weights, tiny sizes) under PyTorch. No torch is needed here.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_user_error

DATA = Path(__file__).parent / "data"
VJEPA = DATA / "official_vjepa_tiny.pth.tar"
AUDIO = DATA / "official_audio_jepa_tiny.ckpt"
VJEPA_GOLDEN = DATA / "golden" / "vjepa_forward.npz"
AUDIO_GOLDEN = DATA / "golden" / "audio_jepa_forward.npz"
# the tiny models are no release: their heads (and the grids' free axis) are given
VJEPA_TINY = ["--heads", "2", "--num-frames", "4"]
AUDIO_TINY = ["--heads", "2", "--pred-heads", "2", "--mel-bins", "16"]


def _import(tmp_path_factory, source, options):
    from click.testing import CliRunner

    from jepa_cli.cli.main import cli

    run = tmp_path_factory.mktemp("import") / "run"
    result = CliRunner().invoke(cli, ["import-checkpoint", str(source), "-o", str(run), *options, "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return run, json.loads(result.stdout)


@pytest.fixture(scope="module")
def vjepa_run(tmp_path_factory):
    return _import(tmp_path_factory, VJEPA, VJEPA_TINY)


@pytest.fixture(scope="module")
def audio_run(tmp_path_factory):
    return _import(tmp_path_factory, AUDIO, AUDIO_TINY)


def _loaded(run):
    from jepa_cli.training.run import load_run

    _config, objective, host, _step = load_run(run)
    return objective, host


def _forward(objective, host, inputs, ctx, tgt):
    """(target encoder features, context tokens, predictions), one compiled program (eager dispatch of
    every op is slower than compiling these tiny models)."""
    import jax

    def run(params, ema, inputs, ctx, tgt):
        z_ctx = objective.encoder(params["encoder"])(inputs, ctx)
        z = objective.predictor(params["predictor"])(z_ctx, ctx, None, tgt, None)
        return objective.encoder(ema)(inputs), z_ctx, z

    return [np.asarray(x) for x in jax.jit(run)(host["params"], host["ema"], inputs, ctx, tgt)]


@pytest.mark.slow
def test_a_vjepa_checkpoint_is_told_by_its_file_and_steps_at_epoch_times_300(vjepa_run):
    run, summary = vjepa_run
    assert (summary["objective"], summary["epoch"], summary["step"]) == ("vjepa", 2, 600)
    record = json.loads((run / "run.json").read_text())
    assert record["config"]["objective"] == "vjepa"
    assert record["imported"]["format"] == "facebookresearch/jepa checkpoint (torch.save)"
    config = record["config"]["objective_config"]
    assert (config["width"], config["depth"], config["heads"], config["pred_width"], config["pred_depth"]) == (
        16, 2, 2, 8, 2)
    assert (config["image_size"], config["patch_size"], config["num_frames"], config["tubelet_size"]) == (16, 4, 4, 2)


@pytest.mark.slow
def test_vjepa_encoders_and_predictor_equal_the_official_ones_per_mask_type(vjepa_run):
    objective, host = _loaded(vjepa_run[0])
    golden = np.load(VJEPA_GOLDEN)
    clips = golden["clips"].transpose(0, 2, 3, 4, 1)  # [B, C, T, H, W] -> [B, T, H, W, C]
    h_full, z_ctx, z = _forward(objective, host, clips, golden["ctx"], golden["tgt"])
    np.testing.assert_allclose(h_full, golden["h_full"], atol=1e-5)  # the target encoder, on the whole clip
    np.testing.assert_allclose(z_ctx, golden["z_ctx"], atol=1e-5)  # [B, 2 mask types, K, D]
    np.testing.assert_allclose(z, golden["z"], atol=1e-5)  # mask type m used mask token m


@pytest.mark.slow
def test_an_audio_jepa_lightning_checkpoint_steps_at_its_global_step(audio_run):
    run, summary = audio_run
    assert (summary["objective"], summary["epoch"], summary["step"]) == ("audio-jepa", 3, 120)
    record = json.loads((run / "run.json").read_text())
    assert record["imported"]["ipe"] == 40  # global_step 120 / epoch 3
    config = record["config"]["objective_config"]
    assert (config["frames"], config["mel_bins"], config["patch_size"], config["norm_eps"]) == (32, 16, 8, 1e-5)


@pytest.mark.slow
def test_audio_jepa_encoders_and_predictor_equal_the_official_ones(audio_run):
    objective, host = _loaded(audio_run[0])
    golden = np.load(AUDIO_GOLDEN)
    spec = golden["spec"].transpose(0, 2, 3, 1)  # [B, 1, frames, mel] -> [B, frames, mel, 1]
    h_full, z_ctx, z = _forward(objective, host, spec, golden["ctx"], golden["tgt"])
    np.testing.assert_allclose(h_full, golden["h_full"], atol=1e-5)
    np.testing.assert_allclose(z_ctx, golden["z_ctx"], atol=1e-5)
    np.testing.assert_allclose(z, golden["z"], atol=1e-5)  # [B, 2 target sets, T, D]


@pytest.mark.slow
@pytest.mark.parametrize("which", ["vjepa", "audio"])
def test_ema_inspect_reads_the_imported_runs(vjepa_run, audio_run, run_cli, which):
    run, summary = vjepa_run if which == "vjepa" else audio_run
    result = run_cli("ema-inspect", run, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["step"] == summary["step"]


@pytest.mark.slow
def test_a_checkpoint_of_another_family_than_objective_says_which_and_writes_nothing(run_cli, tmp_path):
    assert_user_error(run_cli("import-checkpoint", VJEPA, "-o", tmp_path / "run", "--objective", "ijepa"),
                      "V-JEPA checkpoint", "--objective vjepa")
    assert_user_error(run_cli("import-checkpoint", AUDIO, "-o", tmp_path / "run", "--objective", "vjepa"),
                      "Audio-JEPA checkpoint")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_size_that_is_no_release_needs_its_heads(run_cli, tmp_path):
    assert_user_error(run_cli("import-checkpoint", VJEPA, "-o", tmp_path / "run", "--num-frames", "4"),
                      "2 blocks of width 16", "not a released V-JEPA size", "--heads")
    assert_user_error(run_cli("import-checkpoint", AUDIO, "-o", tmp_path / "run", "--mel-bins", "16"),
                      "not a released Audio-JEPA size")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_an_ijepa_option_on_a_vjepa_checkpoint_is_refused(run_cli, tmp_path):
    assert_user_error(run_cli("import-checkpoint", VJEPA, "-o", tmp_path / "run", "--model", "large", *VJEPA_TINY),
                      "--model does not apply")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("source", [VJEPA, AUDIO], ids=["vjepa", "audio"])
def test_a_truncated_checkpoint_is_one_line_and_writes_nothing(run_cli, tmp_path, source):
    cut = tmp_path / "in" / source.name
    cut.parent.mkdir()
    cut.write_bytes(source.read_bytes()[: source.stat().st_size * 2 // 3])
    assert_user_error(run_cli("import-checkpoint", cut, "-o", tmp_path / "out" / "run"), str(cut))
    assert not (tmp_path / "out").exists()


def _torch_zip(path: Path, payload: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", payload)
    return path


@pytest.mark.slow
def test_a_checkpoint_without_a_target_encoder_is_one_line_and_writes_nothing(run_cli, tmp_path):
    import pickle

    source = _torch_zip(tmp_path / "partial.pth.tar", pickle.dumps({"encoder": {}, "predictor": {}, "epoch": 1},
                                                                    protocol=2))
    assert_user_error(run_cli("import-checkpoint", source, "-o", tmp_path / "run"), "no target_encoder")
    assert not (tmp_path / "run").exists()


def test_lightning_hyper_parameters_are_kept_inert_and_tensors_unread_until_selected():
    from jepa_cli.models.torch_checkpoint import Inert, TensorRef, read_torch_checkpoint

    shapes = read_torch_checkpoint(AUDIO, keys=(), inert=True)
    optimizer = shapes["hyper_parameters"]["optimizer"]
    assert isinstance(optimizer, Inert) and optimizer.cls == "functools.partial"
    assert shapes["hyper_parameters"]["ma_callback"].cls == "src.callbacks.MA_weight_update_callback.MAWeightUpdate"
    weight = shapes["state_dict"]["encoder.patch_embed.proj.weight"]
    assert isinstance(weight, TensorRef) and weight.shape == (16, 1, 8, 8)
    loaded = read_torch_checkpoint(AUDIO, keys=("state_dict",), inert=True)
    assert loaded["state_dict"]["encoder.patch_embed.proj.weight"].shape == (16, 1, 8, 8)
    assert isinstance(loaded["optimizer_states"][0]["state"][0]["exp_avg"], TensorRef)


def test_without_inert_mode_a_lightning_checkpoint_is_refused_by_its_first_class():
    from jepa_cli.errors import InputError
    from jepa_cli.models.torch_checkpoint import read_torch_checkpoint

    with pytest.raises(InputError, match="functools.partial"):
        read_torch_checkpoint(AUDIO)


@pytest.mark.slow
def test_inert_mode_still_refuses_a_pickle_that_would_run_code(tmp_path):
    from jepa_cli.errors import InputError
    from jepa_cli.models.torch_checkpoint import read_torch_checkpoint

    # protocol-2 pickle of os.system("true"): GLOBAL 'posix system', a tuple argument, REDUCE
    payload = b"\x80\x02cposix\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03."
    with pytest.raises(InputError, match="posix.system, which would run code"):
        read_torch_checkpoint(_torch_zip(tmp_path / "evil.ckpt", payload), inert=True)


class _Shape:
    def __init__(self, *shape):
        self.shape = shape


def _vjepa_shapes(width: int, depth: int, tokens: int, pred_width: int = 384, pred_depth: int = 12) -> dict:
    """A V-JEPA checkpoint's state dicts as shapes only (no tensor allocated)."""
    encoder = {"patch_embed.proj.weight": _Shape(width, 3, 2, 16, 16), "pos_embed": _Shape(1, tokens, width),
               **{f"blocks.{i}.attn.qkv.weight": _Shape(3 * width, width) for i in range(depth)}}
    predictor = {"predictor_embed.weight": _Shape(pred_width, width), "mask_tokens.0": _Shape(1, 1, pred_width),
                 **{f"predictor_blocks.{i}.mlp.fc1.weight": _Shape(4 * pred_width, pred_width)
                    for i in range(pred_depth)}}
    return {"encoder": encoder, "predictor": predictor, "target_encoder": encoder}


@pytest.mark.parametrize("width, depth, tokens, model, image", [
    (1024, 24, 8 * 14 * 14, "large", 224),  # ViT-L/16, 16 frames x 224 px
    (1280, 32, 8 * 14 * 14, "huge", 224),  # ViT-H/16
    (1280, 32, 8 * 24 * 24, "huge", 384),  # ViT-H/16 at 384 px
])
def test_the_vjepa_releases_are_told_from_their_shapes(width, depth, tokens, model, image):
    from jepa_cli.training.official_model import infer_vjepa_config

    config = infer_vjepa_config(_vjepa_shapes(width, depth, tokens), Path("v.pth.tar"))
    assert config == {"model": model, "patch_size": 16, "image_size": image, "num_frames": 16, "tubelet_size": 2,
                      "channels": 3, "pred_width": 384, "pred_depth": 12}


@pytest.mark.parametrize("width, depth, tokens, message", [
    (768, 12, 8 * 14 * 14, "12 blocks of width 768 is not a released V-JEPA size"),  # a ViT-B/16
    (1024, 24, 8 * 16 * 16, "a large encoder with patch 16, tubelet 2, 16 frames at 256 px is not a V-JEPA release"),
    (1024, 24, 1000, "1000 position embeddings are not 16 frames"),
])
def test_other_vjepa_sizes_are_refused_with_one_line(width, depth, tokens, message):
    from jepa_cli.errors import InputError
    from jepa_cli.training.official_model import infer_vjepa_config

    with pytest.raises(InputError, match=message):
        infer_vjepa_config(_vjepa_shapes(width, depth, tokens), Path("v.pth.tar"))


def test_the_audio_jepa_release_is_told_from_its_shapes():
    from jepa_cli.training.official_model import infer_audio_config

    encoder = {"patch_embed.proj.weight": _Shape(768, 1, 16, 16), "pos_embed": _Shape(1, 128, 768),
               **{f"blocks.{i}.norm1.weight": _Shape(768) for i in range(12)}}
    predictor = {"predictor_embed.weight": _Shape(384, 768),
                 **{f"predictor_blocks.{i}.norm1.weight": _Shape(384) for i in range(6)}}
    config = infer_audio_config({"encoder": encoder, "predictor": predictor}, Path("a.ckpt"))
    assert config == {"model": "base", "patch_size": 16, "mel_bins": 128, "frames": 256, "pred_width": 384,
                      "pred_depth": 6}


# -- the imported runs, exported back, encoded and fine-tuned ------------------------------------------------
def video_dataset(path: Path, n: int = 4, frames: int = 4, size: int = 16, channels: int = 3) -> Path:
    """A video dataset of random uint8 clips [n, frames, size, size, channels] in two classes."""
    from jepa_cli.data import store

    store.write_group(path, store.base_attributes("dataset", modality="video", layout="NTHWC", class_names=["a", "b"],
                                                  source="test", split=None, num_samples=n))
    store.write_array(path / "inputs", np.random.default_rng(0).integers(0, 256, (n, frames, size, size, channels),
                                                                          dtype=np.uint8))
    store.write_array(path / "labels", (np.arange(n) % 2).astype(np.int32))
    return path


def audio_dataset(path: Path, n: int = 4, sample_rate: int = 32000, seconds: float = 10.0) -> Path:
    """An audio dataset of random int16 waveforms [n, samples] in two classes."""
    from jepa_cli.data import store

    store.write_group(path, store.base_attributes("dataset", modality="audio", layout="NS", class_names=["a", "b"],
                                                  sample_rate=sample_rate, seconds=seconds))
    samples = int(sample_rate * seconds)
    store.write_array(path / "inputs", np.random.default_rng(0).integers(-3000, 3000, (n, samples), dtype=np.int16))
    store.write_array(path / "labels", (np.arange(n) % 2).astype(np.int32))
    return path


def _cli(*args):
    from click.testing import CliRunner

    from jepa_cli.cli.main import cli

    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _official_state_dicts(source: Path) -> dict[str, dict[str, np.ndarray]]:
    """{part: {name without wrapper prefixes: tensor}} of an official V-JEPA or Audio-JEPA file."""
    from jepa_cli.models.torch_checkpoint import read_torch_checkpoint
    from jepa_cli.training.official_read import detect_family, official_parts

    checkpoint = read_torch_checkpoint(source, inert=True)
    return official_parts(checkpoint, source, detect_family(checkpoint, source))


@pytest.mark.slow
@pytest.mark.parametrize("which, name", [("vjepa", "again.pth.tar"), ("audio", "again.ckpt")])
def test_the_export_of_an_imported_official_checkpoint_holds_every_tensor(vjepa_run, audio_run, tmp_path, which,
                                                                          name):
    from jepa_cli.models.torch_checkpoint import read_torch_checkpoint

    run, source = (vjepa_run[0], VJEPA) if which == "vjepa" else (audio_run[0], AUDIO)
    result = _cli("export", run, "-o", tmp_path / name, "--all", "-q")
    assert result.exit_code == 0, result.stderr
    official = read_torch_checkpoint(source, inert=True)
    exported = read_torch_checkpoint(tmp_path / name)
    if which == "vjepa":  # facebookresearch/jepa's dict, names as saved through DDP and MultiMaskWrapper
        assert sorted(exported) == ["encoder", "epoch", "jepa_model", "predictor", "target_encoder"]
        assert exported["epoch"] == 2
        pairs = [(official[p], exported[p]) for p in ("encoder", "predictor", "target_encoder")]
    else:  # Lightning's epoch, global_step and state_dict
        assert sorted(exported) == ["epoch", "global_step", "jepa_model", "state_dict"]
        assert (exported["epoch"], exported["global_step"]) == (3, 120)
        pairs = [(official["state_dict"], exported["state_dict"])]
    for want, got in pairs:
        assert sorted(got) == sorted(want)  # pos_embed tables included
        for key, value in want.items():
            assert got[key].dtype == value.dtype and np.array_equal(got[key], value), key


@pytest.mark.slow
@pytest.mark.parametrize("which", ["vjepa", "audio"])
def test_an_exported_imported_run_imports_back_bit_for_bit(vjepa_run, audio_run, tmp_path, which):
    from jepa_cli.training.run import load_run

    run, options = (vjepa_run[0], VJEPA_TINY) if which == "vjepa" else (audio_run[0], AUDIO_TINY)
    assert _cli("export", run, "-o", tmp_path / "out.pth.tar", "--all", "-q").exit_code == 0
    result = _cli("import-checkpoint", tmp_path / "out.pth.tar", "-o", tmp_path / "back", *options, "-q")
    assert result.exit_code == 0, result.stderr
    before, after = load_run(run)[2], load_run(tmp_path / "back")[2]
    assert not np.array_equal(before["params"]["encoder"]["norm"]["scale"], before["ema"]["norm"]["scale"])
    import jax

    flat = lambda tree: {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}  # noqa: E731
    before, after = flat(before), flat(after)
    assert sorted(before) == sorted(after)
    for key, value in before.items():
        assert after[key].dtype == value.dtype and np.array_equal(after[key], value), key


@pytest.mark.slow
def test_encode_latents_on_the_imported_vjepa_run_are_the_target_encoders_tokens(vjepa_run, tmp_path):
    import jax

    from jepa_cli.data.store import read_array

    run = vjepa_run[0]
    data = video_dataset(tmp_path / "clips.zarr")
    result = _cli("encode-latents", run, data, "-o", tmp_path / "z.zarr", "--pool", "none", "--mesh", "data=1", "-q")
    assert result.exit_code == 0, result.stderr
    tokens = read_array(tmp_path / "z.zarr" / "inputs")
    objective, host = _loaded(run)
    transform = objective.eval_transform()
    clips = np.stack([transform({"video": clip, "label": 0})["video"] for clip in read_array(data / "inputs")])
    # the forward the official V-JEPA model gives (test_vjepa_encoders_and_predictor_equal_the_official_ones)
    want = np.asarray(jax.jit(lambda ema, x: objective.encoder(ema)(x))(host["ema"], clips))
    assert tokens.shape == (4, 32, 16)  # 2 x 4 x 4 tubelets of width 16
    np.testing.assert_allclose(tokens, want, atol=1e-5)


@pytest.mark.slow
def test_encode_latents_on_the_imported_audio_run_pool_the_target_encoders_frequency_patches(audio_run, tmp_path):
    import jax

    from jepa_cli.data.store import read_array

    run = audio_run[0]
    data = audio_dataset(tmp_path / "clips.zarr")
    result = _cli("encode-latents", run, data, "-o", tmp_path / "z.zarr", "--pool", "none", "--mesh", "data=1", "-q")
    assert result.exit_code == 0, result.stderr
    tokens = read_array(tmp_path / "z.zarr" / "inputs")
    objective, host = _loaded(run)
    transform = objective.eval_transform()
    waves = np.stack([transform({"audio": w, "label": 0}, None)["audio"] for w in read_array(data / "inputs")])

    def tokens_of(ema, waves):  # the official forward (test_audio_jepa_encoders_and_predictor_equal_the_official_ones)
        z = objective.encoder(ema)(objective.spectrogram(waves))  # [B, 4 time x 2 mel patches, D]
        return z.reshape(z.shape[0], 4, 2, z.shape[-1]).mean(axis=2)

    assert tokens.shape == (4, 4, 16)  # 32 frames / patch 8: 4 time patches of width 16
    np.testing.assert_allclose(tokens, np.asarray(jax.jit(tokens_of)(host["ema"], waves)), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["vjepa", "audio"])
def test_train_resume_fine_tunes_an_imported_run_for_one_step(vjepa_run, audio_run, tmp_path_factory, which):
    import shutil

    run, summary = vjepa_run if which == "vjepa" else audio_run
    root = tmp_path_factory.mktemp("resume")
    tuned = shutil.copytree(run, root / "run")
    data = video_dataset(root / "d.zarr") if which == "vjepa" else audio_dataset(root / "d.zarr")
    result = _cli("train", "--resume", "--out", tuned, "--data", data, "--steps", summary["step"] + 1,
                  "--batch-size", 4, "--mesh", "data=1", "--json", "-q")
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["step"] == summary["step"] + 1 and np.isfinite(out["loss"])
    before, after = _loaded(run)[1], _loaded(tuned)[1]
    moved = before["params"]["encoder"]["norm"]["bias"] - after["params"]["encoder"]["norm"]["bias"]
    assert np.abs(moved).max() > 0  # one AdamW update of the imported encoder
