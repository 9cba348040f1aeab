"""The Audio-JEPA objective (`--objective audio-jepa`): loss, EMA ramp, front-end options, masks,
waveform normalisation, and the CLI path ingest -> train -> encode-latents -> probe on builtin:tones."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_user_error
from jepa_cli.errors import InputError
from jepa_cli.objectives import make_objective
from jepa_cli.objectives.audio_jepa import AudioJEPAObjective, cosine_momentum, normalise_waveform, norm_mse
from jepa_cli.objectives.audio_jepa_config import AudioJEPAConfig
from jepa_cli.training.config import load_toml

# 8 kHz, 0.5 s clips, 16 frames x 16 mel, patch 4 -> a 4 x 4 grid
TINY = dict(model="tiny", width=32, depth=1, heads=2, pred_width=16, pred_depth=1, pred_heads=2, patch_size=4,
            sample_rate=8000, seconds=0.5, frames=16, mel_bins=16, fmax=4000.0)


def test_norm_mse_hand_values():
    target = jnp.array([[1.0, 3.0]])
    assert float(norm_mse(jnp.array([[-1.0, 1.0]]), target)) == pytest.approx(0.0, abs=1e-6)
    assert float(norm_mse(jnp.array([[1.0, 2.0]]), target)) == pytest.approx(2 - 2 / math.sqrt(10), abs=1e-6)
    # mean over valid tokens only: the second token (cos -1 -> loss 4) is padding
    pred = jnp.array([[[1.0, 2.0], [1.0, -1.0]]])
    valid = jnp.array([[True, False]])
    assert float(norm_mse(pred, jnp.array([[[1.0, 3.0], [1.0, 3.0]]]), valid)) == pytest.approx(2 - 2 / math.sqrt(10),
                                                                                                abs=1e-6)


def test_norm_mse_standardises_with_the_unbiased_variance():
    # target [0, 0, 3]: mean 1, unbiased var 3 -> [-1, -1, 2] / sqrt(3 + 1e-6); pred parallel to it gives 0
    assert float(norm_mse(jnp.array([[-1.0, -1.0, 2.0]]), jnp.array([[0.0, 0.0, 3.0]]))) == pytest.approx(0, abs=1e-6)
    # a constant target standardises to 0: its L2 normalisation hits the 1e-12 floor, so cos = 0 and loss = 2
    assert float(norm_mse(jnp.array([[1.0, 2.0]]), jnp.array([[5.0, 5.0]]))) == pytest.approx(2.0)


def test_ema_momentum_cosine_ramp_used_before_it_advances():
    m = lambda s: float(cosine_momentum(s, 0.996, 1.0, 100))  # noqa: E731
    assert m(0) == pytest.approx(0.996)  # the first update uses the starting momentum
    assert m(50) == pytest.approx(0.998)
    assert m(25) == pytest.approx(1 - 0.004 * (math.cos(math.pi / 4) + 1) / 2)
    assert m(100) == pytest.approx(1.0) and m(150) == pytest.approx(1.0)
    obj = AudioJEPAObjective(AudioJEPAConfig(**TINY)).with_total_updates(100)
    assert float(obj.ema_spec.momentum(50)) == pytest.approx(0.998)


def test_defaults_are_audio_jepa():
    cfg = AudioJEPAConfig()
    mc = cfg.model_config
    assert (mc.grid, mc.num_patches, mc.image_size, mc.channels) == ((16, 8), 128, (256, 128), 1)
    assert (mc.embed_dim, mc.encoder_depth, mc.num_heads) == (768, 12, 12)
    assert (mc.pred_width, mc.pred_depth, mc.predictor_heads) == (384, 6, 12)
    fb = cfg.fbank_config
    assert fb.geometry == (3125, 1250, 4096) and cfg.hop_ms == pytest.approx(39.0625)
    assert (fb.num_bins, fb.low_freq, fb.high_freq, fb.window_type) == (128, 20.0, 16000.0, "hanning")
    assert cfg.mask_config.ratio == (0.4, 0.6) and cfg.ema == (0.996, 1.0)


def test_fmax_is_capped_at_nyquist_and_options_round_trip():
    cfg = AudioJEPAConfig(sample_rate=16000, seconds=1.0)
    assert cfg.fbank_config.high_freq == 8000.0
    again = make_objective("audio-jepa", json.loads(json.dumps(cfg.to_dict())))
    assert again.config == cfg
    with pytest.raises(InputError, match="unknown audio-jepa option 'hop'"):
        make_objective("audio-jepa", {"hop": 3})
    with pytest.raises(InputError, match="shorter than one window"):
        AudioJEPAConfig(sample_rate=8000, seconds=0.01, frames=1)


def test_recipes_hold_audio_jepa_optimiser_values():
    as2m = load_toml("builtin:audio-jepa-as2m")
    assert (as2m["lr"], as2m["start_lr"], as2m["final_lr"], as2m["warmup_steps"]) == (1e-3, 1e-6, 0.0, 1000)
    assert (as2m["wd"], as2m["final_wd"], as2m["betas"]) == (1e-6, 1e-6, [0.9, 0.95])
    obj = make_objective("audio-jepa", as2m["objective_config"])
    assert obj.model_config.grid == (16, 8)
    tiny = make_objective("audio-jepa", {**load_toml("builtin:audio-jepa-tones-tiny")["objective_config"],
                                         "sample_rate": 16000, "seconds": 1.0})
    assert tiny.model_config.grid == (8, 4)


def test_waveform_normalisation_removes_the_mean_and_the_peak():
    x = normalise_waveform(np.array([1.0, 3.0, 2.0, 6.0], np.float32))  # mean 3
    np.testing.assert_allclose(x, [-2 / 3, 0, -1 / 3, 1])
    np.testing.assert_array_equal(normalise_waveform(np.zeros(5, np.float32)), 0.0)
    obj = AudioJEPAObjective(AudioJEPAConfig(**TINY))
    out = obj.eval_transform()({"audio": np.full(100, 16384, np.int16), "label": 3}, np.random.default_rng(0))
    assert out["audio"].shape == (4000,) and out["label"] == 3  # padded to 0.5 s at 8 kHz, then normalised
    assert out["audio"].max() == pytest.approx(1.0)


@pytest.fixture(scope="module")
def tones(tmp_path_factory):
    """builtin:tones at 8 kHz, 0.5 s, train and test splits, and a 4-update run."""
    from click.testing import CliRunner

    from jepa_cli.cli.main import cli

    root = tmp_path_factory.mktemp("tones")
    runner = CliRunner()

    def run(*args):
        r = runner.invoke(cli, [str(a) for a in args], catch_exceptions=False, prog_name="jepa")
        assert r.exit_code == 0, r.stderr
        return r.stdout

    for split in ("train", "test"):
        run("ingest", "builtin:tones", root / f"{split}.zarr", "--sample-rate", "8000", "--seconds", "0.5",
            "--split", split, "-q")
    recipe = root / "r.toml"
    recipe.write_text('objective = "audio-jepa"\nmesh = "data=1"\nbatch_size = 16\nlr = 1e-3\nstart_lr = 1e-6\nfinal_lr = 0.0\n'
                      'warmup_steps = 2\nwd = 1e-6\nfinal_wd = 1e-6\nbetas = [0.9, 0.95]\nlog_every = 1\n'
                      '["audio-jepa"]\n' + "".join(f"{k} = {json.dumps(v)}\n" for k, v in TINY.items()
                                                   if k not in ("sample_rate", "seconds")))
    out = json.loads(run("train", "--config", recipe, "--data", root / "train.zarr", "--out", root / "run",
                         "--steps", "4", "--json", "-q"))
    return root, run, out


@pytest.mark.slow
def test_training_on_tones_logs_the_audio_jepa_schedules(tones):
    root, _, out = tones
    assert out["step"] == 4 and math.isfinite(out["loss"])
    rows = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["ema_momentum"] == pytest.approx(0.996)  # update 0 uses the starting momentum
    assert rows[2]["ema_momentum"] == pytest.approx(1 - 0.004 * (math.cos(math.pi * 2 / 4) + 1) / 2)
    assert rows[0]["lr"] == pytest.approx(1e-6 + 0.5 * (1e-3 - 1e-6))  # warmup 2: update 0 at t = 1
    assert all(r["weight_decay"] == pytest.approx(1e-6) for r in rows)
    assert 16 * 0.4 <= rows[0]["target_tokens"] <= 16 * 0.6 + 1
    config = json.loads((root / "run" / "run.json").read_text())["config"]["objective_config"]
    assert (config["sample_rate"], config["seconds"]) == (8000, 0.5)  # from the dataset


@pytest.mark.slow
def test_encode_latents_gives_one_vector_per_time_patch_and_probes_take_them(tones, run_cli):
    root, run, _ = tones
    run("encode-latents", root / "run", root / "test.zarr", "-o", root / "tok.zarr", "--pool", "none", "-q")
    import tensorstore as ts

    tokens = ts.open({"driver": "zarr3", "kvstore": f"file://{root / 'tok.zarr' / 'inputs'}"}).result()
    assert tokens.shape == (60, 4, 32)  # 0.5 s -> 16 frames -> 4 time patches (frequency patches pooled), width 32
    result = run_cli("probe", "linear", root / "tok.zarr", root / "tok.zarr", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["dim"] == 32


def test_encode_pools_the_frequency_patches_of_each_time_step():
    obj = AudioJEPAObjective(AudioJEPAConfig(**TINY))
    params = obj.init(jax.random.key(0))["encoder"]
    waves = jax.random.normal(jax.random.key(1), (2, 4000))
    # one compile: the pooled encoding and the full token grid [2, 16, 32] (time-major 4 x 4)
    z, full = jax.jit(lambda p, w: (obj.encode(p, w), obj._encoder.merge(p)(obj.spectrogram(w))))(params, waves)
    np.testing.assert_allclose(np.asarray(z), np.asarray(full).reshape(2, 4, 4, 32).mean(axis=2), atol=1e-6)


@pytest.mark.slow
def test_probe_raw_on_audio_uses_pooled_log_mel(tones, run_cli):
    root, _, _ = tones
    result = run_cli("probe", "knn", root / "train.zarr", root / "test.zarr", "--raw", "--json")
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["dim"] == 128 and out["top1"] > 0.5  # 10 classes: chance is 0.1


@pytest.mark.slow
def test_modalities_are_refused_across(tones, run_cli, tmp_path):
    root, _, _ = tones
    np.save(tmp_path / "d.npy", np.zeros((16, 16, 16), np.uint8))
    assert run_cli("ingest", tmp_path / "d.npy", tmp_path / "d.zarr").exit_code == 0
    small = 'model = "tiny"\nwidth = 16\ndepth = 1\nheads = 1\npred_width = 16\npred_depth = 1\npred_heads = 1\n'  # cheap to build
    (tmp_path / "a.toml").write_text(f'objective = "audio-jepa"\nbatch_size = 8\n["audio-jepa"]\n{small}')
    (tmp_path / "i.toml").write_text(f'objective = "ijepa"\nbatch_size = 8\n[ijepa]\n{small}image_size = 16\n')
    result = run_cli("train", "--config", tmp_path / "a.toml", "--data", tmp_path / "d.zarr", "--out", tmp_path / "r",
                     "--steps", "1")
    assert_user_error(result, "modality is 'image'", "'audio'")
    result = run_cli("train", "--config", tmp_path / "i.toml", "--data", root / "train.zarr", "--out",
                     tmp_path / "r2", "--steps", "1")
    assert_user_error(result, "modality is 'audio'")


def test_the_default_audio_jepa_encoder_traces_on_10_s_clips_at_32_khz():
    obj = AudioJEPAObjective(AudioJEPAConfig(total_updates=10))  # ViT-B, 256 x 128, 16 x 8 patches
    shapes = obj.param_shapes()
    waves = jax.ShapeDtypeStruct((2, 320000), jnp.float32)
    assert jax.eval_shape(obj.spectrogram, waves).shape == (2, 256, 128, 1)  # 254 Kaldi frames padded to 256
    assert jax.eval_shape(obj.encode, shapes["encoder"], waves).shape == (2, 16, 768)  # 16 vectors per 10 s


@pytest.mark.slow
def test_encoding_audio_counts_its_progress_in_clips(tones, run_cli, monkeypatch):
    from jepa_cli.cli.common import ProgressHandle

    monkeypatch.setattr(ProgressHandle, "PLAIN_AFTER_S", 0.0)  # a plain progress line from the first batch
    root, _, _ = tones
    result = run_cli("encode-latents", root / "run", root / "test.zarr", "-o", root / "clips.zarr")
    assert result.exit_code == 0, result.stderr
    assert "60/60 clips" in result.stderr and "images" not in result.stderr
