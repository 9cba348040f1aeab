"""A run and a dataset that do not go together are refused with the next command for the modalities
at hand (evaluation/features.check_modality_pair, evaluation/encode.source_attributes): ingesting data
of the kind the encoder reads, with the run's clip shape, or training a run on the dataset's kind; a
latent set points to the dataset it was encoded from."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from conftest import assert_user_error
from jepa_cli.data import store
from jepa_cli.errors import InputError
from jepa_cli.evaluation.features import check_modality_pair

ENCODERS = {"image": SimpleNamespace(name="ijepa", modalities=("image",), config=SimpleNamespace()),
            "audio": SimpleNamespace(name="audio-jepa", modalities=("audio",),
                                     config=SimpleNamespace(sample_rate=16000, seconds=1.0)),
            "video": SimpleNamespace(name="vjepa", modalities=("video",), config=SimpleNamespace(num_frames=8))}
NEXT = {  # (the encoder's modality, the dataset's) -> the hint after "give "
    ("audio", "image"): "audio data (jepa ingest AUDIO_FOLDER OUT.zarr --sample-rate 16000 --seconds 1), or a run "
                        "trained on image data (jepa train --objective ijepa --data d.zarr --out RUN)",
    ("video", "image"): "video data (jepa ingest VIDEO_FOLDER OUT.zarr --frames 8), or a run trained on image data "
                        "(jepa train --objective ijepa --data d.zarr --out RUN)",
    ("image", "audio"): "image data (jepa ingest IMAGE_FOLDER OUT.zarr), or a run trained on audio data "
                        "(jepa train --objective audio-jepa --data d.zarr --out RUN)",
    ("video", "audio"): "video data (jepa ingest VIDEO_FOLDER OUT.zarr --frames 8), or a run trained on audio data "
                        "(jepa train --objective audio-jepa --data d.zarr --out RUN)",
    ("image", "video"): "image data (jepa ingest IMAGE_FOLDER OUT.zarr), or a run trained on video data "
                        "(jepa train --objective vjepa --data d.zarr --out RUN)",
    ("audio", "video"): "audio data (jepa ingest AUDIO_FOLDER OUT.zarr --sample-rate 16000 --seconds 1), or a run "
                        "trained on video data (jepa train --objective vjepa --data d.zarr --out RUN)",
}


@pytest.mark.parametrize("encoder_modality, data_modality", sorted(NEXT))
def test_a_mismatched_pair_names_the_next_command_for_both_modalities(encoder_modality, data_modality):
    encoder = ENCODERS[encoder_modality]
    with pytest.raises(InputError) as refused:
        check_modality_pair("d.zarr", data_modality, encoder, "runs/r")
    assert str(refused.value) == (f"d.zarr holds {data_modality} samples, but runs/r (objective {encoder.name!r}) "
                                  f"encodes {encoder_modality} samples: give {NEXT[encoder_modality, data_modality]}")


def _latent_set(path, provenance=None):
    extra = {"provenance": provenance} if provenance else {}
    store.write_group(path, store.base_attributes("dataset", modality="latent", layout="ND", **extra))
    store.write_array(path / "inputs", np.zeros((4, 8), np.float32))
    return path


@pytest.mark.slow
def test_encode_latents_of_a_latent_set_points_to_the_dataset_it_was_encoded_from(tmp_path, run_cli):
    latents = _latent_set(tmp_path / "emb.zarr", {"run": "runs/audio", "source": "/data/sounds.zarr"})
    result = run_cli("encode-latents", tmp_path / "run", latents, "-o", tmp_path / "out.zarr")
    assert_user_error(result, f"{latents}: is already a latent dataset (encode-latents' output): give the dataset it "
                              f"was encoded from, /data/sounds.zarr, or probe it as it is, without --run (jepa probe "
                              f"knn {latents} TEST.zarr)")
    assert not (tmp_path / "out.zarr").exists()


@pytest.mark.slow
def test_a_latent_set_without_provenance_names_every_modality(tmp_path, run_cli):
    latents = _latent_set(tmp_path / "emb.zarr")
    result = run_cli("encode-latents", tmp_path / "run", latents, "-o", tmp_path / "out.zarr")
    assert_user_error(result, "give the image, audio or video dataset it was encoded from, or probe it as it is")
