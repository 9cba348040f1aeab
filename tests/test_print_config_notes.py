"""`jepa train --print-config` says where EDM's sigma_data came from, in a comment beside the key."""

import tomllib

from jepa_cli.objectives.diffusion import DiffusionObjective
from jepa_cli.training.config import build_config, to_toml


def _printed(**objective_config) -> str:
    config = build_config({"objective": "diffusion", "objective_config": objective_config})
    return to_toml(config, {"diffusion": DiffusionObjective.config_notes(config.objective_config)})


def test_sigma_data_taken_from_standardised_latents_is_noted_beside_the_key():
    text = _printed(schedule="edm", modality="latent", sigma_data=1.0)
    line = next(line for line in text.splitlines() if line.startswith("sigma_data = "))
    assert line == ("sigma_data = 1.0  # from the data: latents standardised by the dataset's "
                    "latent_shift/latent_scale have std 1")
    assert tomllib.loads(text)["diffusion"]["sigma_data"] == 1.0  # the comment keeps the recipe readable


def test_a_given_sigma_data_is_noted_as_given_and_the_cosine_schedule_gets_no_note():
    assert "sigma_data = 0.3  # given" in _printed(schedule="edm", modality="image", sigma_data=0.3)
    assert "#" not in _printed(schedule="cosine", modality="image", sigma_data=0.5)
