"""LeJEPA (`--objective lejepa`) on audio and video datasets: the views (log-mel crops along time and
frequency, spatio-temporal clip crops), the geometry the options give, one run per modality through
every command (train with --probe-every, encode-latents, probe, ema-inspect, runs, plot, export, the
Python API), and the refusals: one line, exit 2, nothing written."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jepa_cli.data import transforms
from jepa_cli.objectives import LeJEPAConfig, make_objective
from jepa_cli.objectives.lejepa import crop_boxes, resized_crop, spectrogram_views

TINY = {"width": 32, "depth": 1, "heads": 2, "proj_dims": [32, 16], "views_local": 2, "sigreg_slices": 8}
RECIPE = """
objective = "lejepa"
steps = 3
batch_size = 8
mesh = "data=1"
save_every = 3
log_every = 1
[lejepa]
width = 32
depth = 1
heads = 2
proj_dims = [32, 16]
views_local = 2
sigreg_slices = 8
"""
VIDEO_KEYS = "patch_size = 8\ntubelet_size = 4\nglobal_frames = 8\n"  # 16 frames of 32x32: 4 x 4 x 4 tokens
AUDIO_KEYS = "patch_size = 16\nnorm_eps = 1e-5\n"  # 0.5 s at 8 kHz: a 48 x 128 log-mel, 3 x 8 tokens; Audio-JEPA's eps


# -- the audio views ----------------------------------------------------------------------------------

def test_crop_boxes_lie_inside_the_input_with_areas_in_the_scale_range():
    boxes = np.asarray(crop_boxes(jax.random.key(0), 500, 40, 64, (0.2, 0.5), (0.5, 2.0)))
    top, left, h, w = boxes.T
    assert np.all(top >= 0) and np.all(left >= 0) and np.all(top + h <= 40) and np.all(left + w <= 64)
    assert np.all(h >= 1) and np.all(w >= 1)
    area = h * w / (40 * 64)
    # rounding each side by at most 0.5 moves the area by little; clipping to the input only shrinks it
    assert area.max() <= 0.5 * 1.1 and np.median(area) > 0.2
    assert len({tuple(b) for b in boxes}) > 400  # every crop is drawn anew


def test_a_whole_input_box_resized_to_its_own_size_is_the_input():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(12, 20)), jnp.float32)
    out = resized_crop(x, jnp.array([0.0, 0.0, 12.0, 20.0]), (12, 20))
    np.testing.assert_allclose(np.asarray(out), np.asarray(x), atol=1e-5)


def test_a_box_at_its_own_size_is_the_slice_of_the_input_it_covers():
    x = np.random.default_rng(1).normal(size=(12, 20)).astype(np.float32)
    out = resized_crop(jnp.asarray(x), jnp.array([3.0, 5.0, 6.0, 8.0]), (6, 8))  # rows 3-8, columns 5-12
    np.testing.assert_allclose(np.asarray(out), x[3:9, 5:13], atol=1e-5)


def test_a_box_resized_to_twice_its_size_repeats_its_values_on_average():
    x = np.random.default_rng(2).normal(size=(10, 10)).astype(np.float32)
    out = np.asarray(resized_crop(jnp.asarray(x), jnp.array([2.0, 2.0, 4.0, 4.0]), (8, 8)))
    # linear interpolation of a crop keeps its values' range and, over the whole crop, about its mean
    crop = x[2:6, 2:6]
    assert crop.min() - 1e-5 <= out.min() and out.max() <= crop.max() + 1e-5


def test_spectrogram_views_are_count_crops_of_each_example_at_the_view_size():
    spec = jnp.asarray(np.random.default_rng(3).normal(size=(3, 48, 64)), jnp.float32)
    views = spectrogram_views(spec, jax.random.key(1), 4, (16, 32), (0.3, 1.0), (0.75, 4 / 3))
    assert views.shape == (3, 4, 16, 32, 1)
    whole = spectrogram_views(spec, jax.random.key(1), 2, (48, 64), (1.0, 1.0), (64 / 48, 64 / 48))
    np.testing.assert_allclose(np.asarray(whole[:, 0, ..., 0]), np.asarray(spec), atol=1e-4)  # scale 1: the whole


# -- the video views ----------------------------------------------------------------------------------

def _clip(t=8, size=12, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (t, size, size, 1)).astype(np.uint8)


def test_clip_views_are_windows_of_frames_at_their_sizes_under_their_keys():
    views = (transforms.ViewSpec(2, (12, 12), (0.3, 1.0), 6), transforms.ViewSpec(3, (6, 6), (0.05, 0.3), 2))
    fn = transforms.clip_multi_view(views, ("video", "video_local"), (0.5,), (0.5,))
    out = fn({"video": _clip(), "label": 4}, np.random.default_rng(0))
    assert out["video"].shape == (2, 6, 12, 12, 1) and out["video_local"].shape == (3, 2, 6, 6, 1)
    assert out["label"] == 4


def test_a_clip_view_uncropped_unaugmented_is_a_run_of_consecutive_normalised_frames():
    clip = _clip(t=8, size=10, seed=1)
    fn = transforms.clip_multi_view((transforms.ViewSpec(1, (10, 10), (1.0, 1.0), 3),), ("video",), (0.5,), (0.25,),
                                    ratio=(1.0, 1.0), hflip=False, jitter_prob=0.0, grayscale_prob=0.0)
    got = fn({"video": clip}, np.random.default_rng(5))["video"][0]  # [3, 10, 10, 1]
    want = [(clip[s:s + 3] / 255.0 - 0.5) / 0.25 for s in range(6)]
    assert any(np.allclose(got, w, atol=1e-4) for w in want)


def test_clip_views_longer_than_the_clip_are_refused():
    from jepa_cli.errors import InputError

    fn = transforms.clip_multi_view((transforms.ViewSpec(1, (12, 12), (0.3, 1.0), 10),), ("video",))
    with pytest.raises(InputError, match="shorter than the views' 10"):
        fn({"video": _clip(t=8)}, np.random.default_rng(0))


# -- the geometry the options give ------------------------------------------------------------------

def test_one_second_at_16_khz_is_a_96_by_128_log_mel_of_16_patches():
    c = LeJEPAConfig(modality="audio", sample_rate=16000, seconds=1.0, patch_size=16)
    assert c.log_mel_shape == (1 + (16000 - 400) // 160, 128)  # Kaldi: 25 ms frames every 10 ms, 128 mel bins
    assert c.global_size == (96, 128)  # 98 frames cut to whole patches
    assert c.local_size_pixels == (48, 64)  # 98/224 of 96 and of 128 (42, 56) rounded to whole patches of 16
    assert c.model_config.channels == 1 and c.model_config.grid == (6, 8)


def test_video_views_default_to_the_whole_clip_and_98_224_of_it_in_whole_tubelets():
    c = LeJEPAConfig(modality="video", num_frames=16, tubelet_size=4, image_size=32, patch_size=8, channels=1)
    assert c.global_model_config.grid3d == (4, 4, 4)
    assert c.local_model_config.grid3d == (2, 2, 2)  # 16 x 98/224 = 7 frames -> 8 (2 tubelets), 14 px -> 16
    short = LeJEPAConfig(modality="video", num_frames=16, tubelet_size=4, image_size=32, patch_size=8, channels=1,
                         global_frames=8, local_frames=4)
    assert short.global_model_config.grid3d == (2, 4, 4) and short.local_model_config.grid3d == (1, 2, 2)
    assert short.model_config.grid3d == (4, 4, 4)  # evaluation reads the whole clip


def test_the_dataset_gives_the_modality_and_its_geometry():
    cls = type(make_objective("lejepa", {}))
    audio = {"modality": "audio", "shape": [8000], "attrs": {"sample_rate": 16000}}
    video = {"modality": "video", "shape": [16, 32, 48, 1], "attrs": {}}
    assert cls.dataset_options(audio) == {"sample_rate": 16000, "seconds": 0.5, "modality": "audio"}
    assert cls.dataset_options(video) == {"num_frames": 16, "channels": 1, "image_size": [32, 48], "modality": "video"}
    assert list(cls.dataset_options(audio))[-1] == "modality"  # filled last, after the geometry it reads


def test_the_objective_trains_on_the_modality_its_views_are_cut_from():
    assert make_objective("lejepa", {**TINY, "modality": "audio"}).modalities == ("audio",)
    assert make_objective("lejepa", {**TINY, "modality": "video", "patch_size": 8, "image_size": 32}).modalities == \
        ("video",)
    assert make_objective("lejepa", TINY).modalities == ("image",)


def test_the_audio_loss_is_one_minus_lambda_invariance_plus_lambda_sigreg():
    objective = make_objective("lejepa", {**TINY, "modality": "audio", "sample_rate": 8000, "seconds": 0.5,
                                          "patch_size": 16, "sigreg_weight": 0.2})
    params = objective.init(jax.random.key(0))
    waves = jnp.asarray(np.random.default_rng(0).normal(size=(4, 4000)), jnp.float32)
    value, aux = jax.jit(lambda p, b, k: objective.loss(p, None, b, k, 0))(params, {"audio": waves}, jax.random.key(1))
    assert float(value) == pytest.approx(0.8 * float(aux["inv_loss"]) + 0.2 * float(aux["sigreg"]), rel=1e-5)
    assert float(aux["inv_loss"]) > 0  # the views differ: random crops along time and frequency


# -- through the CLI, one run per modality ------------------------------------------------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Per modality: builtin datasets (tones: 0.5 s at 8 kHz; moving-digits: 40 clips) and a 3-update
    lejepa run on each, probed every 2 updates."""
    from click.testing import CliRunner

    from jepa_cli.cli.main import cli

    root = tmp_path_factory.mktemp("lejepa-av")

    def run(*args):
        result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False, prog_name="jepa")
        assert result.exit_code == 0, result.stderr
        return result.stdout

    for split in ("train", "test"):
        run("ingest", "builtin:tones", root / f"audio-{split}.zarr", "--sample-rate", "8000", "--seconds", "0.5",
            "--split", split, "-q")
    run("ingest", "builtin:moving-digits", root / "video-train.zarr", "--limit", "40", "-q")
    run("ingest", "builtin:moving-digits", root / "video-test.zarr", "--limit", "16", "-q")
    summaries = {}
    for modality, keys in (("audio", AUDIO_KEYS), ("video", VIDEO_KEYS)):
        (root / f"{modality}.toml").write_text(RECIPE + keys)
        train, test = root / f"{modality}-train.zarr", root / f"{modality}-test.zarr"
        summaries[modality] = json.loads(run("train", "--config", root / f"{modality}.toml", "--data", train,
                                             "--out", root / f"{modality}-run", "--probe-every", "2",
                                             "--probe-data", f"{train},{test}", "--json", "-q"))
    return root, run, summaries


@pytest.mark.slow
@pytest.mark.parametrize("modality", ["audio", "video"])
def test_a_run_trains_logs_both_terms_and_probes_during_training(runs, modality):
    root, _, summaries = runs
    assert summaries[modality]["objective"] == "lejepa" and summaries[modality]["checkpoints"] == [3]
    assert summaries[modality]["probe"]["step"] == 2 and 0 <= summaries[modality]["probe"]["knn_top1"] <= 1
    rows = [json.loads(line) for line in (root / f"{modality}-run" / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "inv_loss" in r][-1]
    assert last["loss"] == pytest.approx(0.95 * last["inv_loss"] + 0.05 * last["sigreg"], rel=1e-4)
    config = json.loads((root / f"{modality}-run" / "run.json").read_text())["config"]["objective_config"]
    assert config["modality"] == modality  # from the dataset


@pytest.mark.slow
@pytest.mark.parametrize("modality, dim", [("audio", 32), ("video", 32)])
def test_encode_latents_and_both_probes_read_the_run(runs, modality, dim):
    root, run, _ = runs
    for split in ("train", "test"):
        run("encode-latents", root / f"{modality}-run", root / f"{modality}-{split}.zarr", "-o",
            root / f"{modality}-lat-{split}.zarr", "-q")
    for probe in ("linear", "knn"):
        out = json.loads(run("probe", probe, root / f"{modality}-lat-train.zarr", root / f"{modality}-lat-test.zarr",
                             "--json"))
        assert out["dim"] == dim and 0.0 <= out["top1"] <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("modality, tokens", [("audio", 3 * 8), ("video", 4 * 4 * 4)])
def test_the_api_encodes_whole_examples_as_encode_latents_does(runs, modality, tokens):
    from jepa_cli import api

    root, run, _ = runs
    data = api.load_dataset(root / f"{modality}-test.zarr")
    model = api.load_run(root / f"{modality}-run")
    z = model.encode(data.inputs[:5], pool="none")
    assert z.shape == (5, tokens, 32)  # the whole log-mel (3 x 8 patches) or clip (4 x 4 x 4 tubelets)
    run("encode-latents", root / f"{modality}-run", root / f"{modality}-test.zarr", "-o",
        root / f"{modality}-api.zarr", "-q")
    np.testing.assert_allclose(model.encode(data.inputs[:5]), api.load_dataset(root / f"{modality}-api.zarr").inputs[:5],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("modality", ["audio", "video"])
def test_ema_inspect_runs_and_plot_take_the_run(runs, modality, run_cli, tmp_path):
    root, _, _ = runs
    result = run_cli("ema-inspect", root / f"{modality}-run")
    assert result.exit_code == 2
    assert "keeps no EMA" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    result = run_cli("runs", root / f"{modality}-run", "--json")
    assert result.exit_code == 0 and "lejepa" in result.stdout
    assert run_cli("plot", root / f"{modality}-run", "-o", tmp_path / "p.png").exit_code == 0
    assert (tmp_path / "p.png").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.parametrize("modality, layout, qkv, geometry", [
    ("audio", "LudovicTuncay/Audio-JEPA", "blocks.0.attn.Wqkv.weight",  # flash_attn's MHA names
     {"objective": "audio-jepa", "frames": 48, "mel_bins": 128, "channels": 1}),
    ("video", "facebookresearch/jepa", "blocks.0.attn.qkv.weight",
     {"objective": "vjepa", "num_frames": 16, "tubelet_size": 4, "image_size": 32}),
])
def test_export_writes_the_one_encoder_in_the_layout_of_its_modality_s_jepa(runs, run_cli, tmp_path, modality, layout,
                                                                           qkv, geometry):
    from safetensors import safe_open

    from jepa_cli import api

    root, _, _ = runs
    out = tmp_path / "enc.safetensors"
    result = run_cli("export", root / f"{modality}-run", "-o", out)
    assert result.exit_code == 0, result.stderr
    with safe_open(str(out), "np") as f:
        meta = f.metadata()
        weight = f.get_tensor(qkv)
    assert meta["layout"] == layout and meta["parts"] == "target_encoder"
    assert geometry.items() <= json.loads(meta["jepa_model"]).items()
    # torch's Linear stores [out, in]: the transpose of the encoder's [in, out] kernel
    kernel = api.load_run(root / f"{modality}-run").encoder_params["blocks"]["0"]["attn"]["qkv"]["kernel"]
    np.testing.assert_array_equal(weight, np.asarray(kernel).T)
    refused = run_cli("export", root / f"{modality}-run", "-o", tmp_path / "all.safetensors", "--all")
    assert refused.exit_code == 2 and "has one encoder, no predictor and no EMA" in refused.stderr
    assert not (tmp_path / "all.safetensors").exists()


@pytest.mark.slow
def test_a_run_refuses_data_of_another_modality(runs, run_cli, tmp_path):
    root, _, _ = runs
    result = run_cli("encode-latents", root / "audio-run", root / "video-test.zarr", "-o", tmp_path / "x.zarr")
    assert result.exit_code == 2 and "encodes audio samples" in result.stderr
    assert not (tmp_path / "x.zarr").exists()


# -- bad input: one line, exit 2, nothing written -----------------------------------------------------

BAD = [
    (["--sigreg-weight", "1.5"], "sigreg_weight must be in [0, 1], got 1.5"),
    (["--sigreg-weight", "-0.01"], "sigreg_weight must be in [0, 1], got -0.01"),
    (["--sigreg-slices", "0"], "sigreg_slices must be >= 1, got 0"),
    (["--sigreg-slices", "-4"], "sigreg_slices must be >= 1, got -4"),
    (["--sigreg-knots", "0"], "sigreg_knots must be >= 2, got 0"),
    (["--sigreg-knots", "-3"], "sigreg_knots must be >= 2, got -3"),
    (["--sigreg-t-max", "0"], "sigreg_t_max must be > 0, got 0.0"),
    (["--sigreg-t-max", "-1"], "sigreg_t_max must be > 0, got -1.0"),
    (["--views-global", "1", "--views-local", "0"], "at least 2 views of each example"),
    (["--views-global", "0", "--views-local", "1"], "views_global >= 1"),
    (["--pred-depth", "2"], "unknown lejepa option 'pred_depth'"),
    (["--npred", "4"], "unknown lejepa option 'npred'"),
    (["--var-weight", "1"], "unknown lejepa option 'var_weight'"),
]


def _refused(run_cli, root, tmp_path, modality, args, message, recipe=True):
    out = tmp_path / "run"
    config = ["--config", root / f"{modality}.toml"] if recipe else []
    result = run_cli("train", *config, "--data", root / f"{modality}-train.zarr", "--out", out, "--steps", "1",
                     "--batch-size", "8", "-q", *args)
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("modality", ["audio", "video"])
@pytest.mark.parametrize("args, message", BAD)
def test_bad_lejepa_options_are_refused_on_audio_and_video(runs, run_cli, tmp_path, modality, args, message):
    _refused(run_cli, runs[0], tmp_path, modality, args, message)


@pytest.mark.slow
@pytest.mark.parametrize("modality, args, message", [
    ("audio", ["--local-size", "64x64"], "local_size 64x64 is larger than the input, the log-mel's (frames x mel bins) "
                                         "48x128"),
    ("video", ["--local-size", "48"], "local_size 48x48 is larger than the input, image_size 32x32"),
    ("video", ["--local-frames", "20"], "local_frames 20 is larger than the input, num_frames 16"),
    ("video", ["--global-frames", "32"], "global_frames 32 is larger than the input, num_frames 16"),
    ("video", ["--global-frames", "6"], "global_frames 6 must be positive whole tubelets of 4 frames"),
    ("video", ["--local-frames", "0"], "local_frames 0 must be positive whole tubelets of 4 frames"),
    ("audio", ["--global-frames", "8"], "global_frames applies to video clips; the dataset holds audio"),
])
def test_views_larger_than_the_input_or_of_another_modality_are_refused(runs, run_cli, tmp_path, modality, args,
                                                                         message):
    _refused(run_cli, runs[0], tmp_path, modality, args, message)


@pytest.mark.slow
@pytest.mark.parametrize("modality, objective, args, message", [
    ("audio", "audio-jepa", ["--views-local", "2"], "unknown audio-jepa option 'views_local'"),
    ("audio", "audio-jepa", ["--global-frames", "8"], "unknown audio-jepa option 'global_frames'"),
    ("video", "vjepa", ["--local-frames", "4"], "unknown vjepa option 'local_frames'"),
    ("video", "vjepa", ["--proj-dims", "8,8"], "unknown vjepa option 'proj_dims'"),
])
def test_a_lejepa_option_given_to_another_objective_is_refused(runs, run_cli, tmp_path, modality, objective, args,
                                                               message):
    _refused(run_cli, runs[0], tmp_path, modality, ["--objective", objective, *args], message, recipe=False)
