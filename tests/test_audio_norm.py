"""Audio-JEPA's input options beyond the released recipe: the log-mel standardised with the training set's
statistics (spec_norm "dataset", measured by the trainer and recorded in run.json) and patches of another
shape than patch_size squares (patch_frames x patch_mels, time strips across every mel bin)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from jepa_cli.data import store
from jepa_cli.errors import InputError
from jepa_cli.objectives.audio_jepa import AudioJEPAObjective, log_mel
from jepa_cli.objectives.audio_jepa_config import AudioJEPAConfig

TINY = dict(model="tiny", width=32, depth=1, heads=2, pred_width=16, pred_depth=1, pred_heads=2, patch_size=4,
            sample_rate=8000, seconds=0.5, frames=16, mel_bins=16, fmax=4000.0)


def _waves(n: int = 3) -> np.ndarray:
    return np.random.default_rng(0).normal(0, 0.3, (n, 4000)).astype(np.float32)


def test_off_by_default_the_encoder_reads_the_log_mel_itself():
    obj = AudioJEPAObjective(AudioJEPAConfig(**TINY))
    w = _waves()
    np.testing.assert_array_equal(np.asarray(obj.spectrogram(w)), np.asarray(log_mel(w, obj.config)))


def test_dataset_normalisation_is_the_log_mel_minus_the_mean_over_twice_the_std():
    obj = AudioJEPAObjective(AudioJEPAConfig(**TINY, spec_norm="dataset", spec_mean=-5.0, spec_std=4.0))
    w = _waves()
    x = np.asarray(log_mel(w, obj.config))
    np.testing.assert_allclose(np.asarray(obj.spectrogram(w)), (x + 5.0) / 8.0, rtol=1e-6, atol=1e-6)


def test_clip_normalisation_subtracts_each_mel_bins_mean_over_the_frames():
    obj = AudioJEPAObjective(AudioJEPAConfig(**TINY, spec_norm="clip"))
    w = _waves()
    y = np.asarray(obj.spectrogram(w))  # [3, 16 frames, 16 mel, 1]
    x = np.asarray(log_mel(w, obj.config))
    np.testing.assert_allclose(y.mean(axis=1), 0.0, atol=1e-5)
    np.testing.assert_allclose(y, x - x.mean(axis=1, keepdims=True), rtol=0, atol=1e-5)


def test_time_strips_regroup_each_patch_into_the_channels_frame_major():
    obj = AudioJEPAObjective(AudioJEPAConfig(**TINY, patch_frames=2, patch_mels=16))
    assert obj.model_config.grid == (8, 1) and obj.model_config.channels == 32 and obj.model_config.patch_size == 1
    w = _waves()
    x = np.asarray(log_mel(w, obj.config))[..., 0]  # [B, 16 frames, 16 mel]
    y = np.asarray(obj.spectrogram(w))  # [B, 8, 1, 32]
    assert y.shape == (3, 8, 1, 32)
    np.testing.assert_array_equal(y[:, 3, 0, :16], x[:, 6, :])  # strip 3: frames 6 and 7, every mel bin
    np.testing.assert_array_equal(y[:, 3, 0, 16:], x[:, 7, :])


def test_rectangular_patches_encode_one_vector_per_time_patch():
    obj = AudioJEPAObjective(AudioJEPAConfig(**TINY, patch_frames=2, patch_mels=8))
    params = obj.init(jax.random.key(0))
    z = obj.encode(params["encoder"], _waves(2))
    assert z.shape == (2, 8, 32)  # 16 frames / 2 time patches, the 2 mel patches pooled


def _dataset(path, waves: np.ndarray):
    store.write_group(path, store.base_attributes("dataset", modality="audio", layout="NS", class_names=["a", "b"],
                                                  sample_rate=8000, seconds=0.5))
    store.write_array(path / "inputs", waves)
    store.write_array(path / "labels", np.arange(len(waves), dtype=np.int32) % 2)
    return path


@pytest.mark.slow
def test_the_statistics_are_those_of_every_log_mel_value_of_the_training_set(tmp_path):
    waves = _waves(5)
    data = _dataset(tmp_path / "d.zarr", waves)
    obj = AudioJEPAObjective(AudioJEPAConfig(**TINY, spec_norm="dataset"))
    fitted = obj.fit_to_data(data)
    transform = obj.eval_transform()
    x = np.asarray(log_mel(np.stack([transform({"audio": w}, None)["audio"] for w in waves]), obj.config), np.float64)
    assert fitted.config.spec_mean == pytest.approx(x.mean(), rel=1e-6)  # jitted float32 log-mel
    assert fitted.config.spec_std == pytest.approx(x.std(), rel=1e-6)
    given = AudioJEPAObjective(AudioJEPAConfig(**TINY, spec_norm="dataset", spec_mean=1.0, spec_std=2.0))
    assert given.fit_to_data(data) is given  # values given by hand are kept


@pytest.mark.slow
def test_a_run_records_the_statistics_in_run_json_and_encode_latents_applies_them(run_cli, tmp_path):
    data = _dataset(tmp_path / "d.zarr", _waves(8))
    recipe = tmp_path / "r.toml"
    table = "\n".join(f"{k} = {json.dumps(v)}" for k, v in TINY.items() if k not in ("sample_rate", "seconds"))
    recipe.write_text(f'objective = "audio-jepa"\nsteps = 0\nbatch_size = 8\nmesh = "data=1"\n["audio-jepa"]\n{table}\n'
                      'spec_norm = "dataset"\n')
    result = run_cli("train", "--config", recipe, "--data", data, "--out", tmp_path / "run", "--quiet")
    assert result.exit_code == 0, result.stderr
    config = json.loads((tmp_path / "run" / "run.json").read_text())["config"]["objective_config"]
    fitted = AudioJEPAObjective(AudioJEPAConfig(**TINY, spec_norm="dataset")).fit_to_data(data)
    assert (config["spec_mean"], config["spec_std"]) == (fitted.config.spec_mean, fitted.config.spec_std)
    result = run_cli("encode-latents", tmp_path / "run", data, "-o", tmp_path / "emb.zarr", "--quiet")
    assert result.exit_code == 0, result.stderr
    model = store.read_attributes(tmp_path / "emb.zarr")["provenance"]["model"]
    assert model["spec_mean"] == fitted.config.spec_mean


@pytest.mark.parametrize("extra, message", [
    ({"spec_mean": 1.0, "spec_std": 2.0}, 'spec_mean and spec_std apply to spec_norm = "dataset"'),
    ({"spec_norm": "clip", "spec_mean": 1.0, "spec_std": 2.0}, 'spec_mean and spec_std apply to spec_norm = "dataset"'),
    ({"spec_norm": "dataset", "spec_mean": 1.0}, "spec_mean and spec_std go together"),
    ({"spec_norm": "dataset", "spec_mean": 1.0, "spec_std": 0.0}, "spec_std must be > 0, got 0.0"),
    ({"patch_frames": 3}, "patches of 3 frames x 4 mel bins do not tile 16 frames x 16 mel bins"),
    ({"patch_mels": 0}, "patch_mels must be >= 1, got 0"),
])
def test_bad_normalisation_or_patch_options_are_refused(extra, message):
    with pytest.raises(InputError, match=message):
        AudioJEPAConfig(**TINY, **extra)


def test_an_unknown_spec_norm_is_refused_naming_the_choices():
    with pytest.raises(InputError, match="unknown spec_norm 'global' .choose from none, dataset, clip."):
        AudioJEPAConfig(**TINY, spec_norm="global")
