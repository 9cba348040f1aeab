"""Every command that hands a run's encoder a dataset refuses a dataset of another modality with one
line naming both (evaluation/features.check_modality_pair): encode-latents, probe --run, fd --run and
train --probe-data, over every pair of image, audio and video."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from conftest import assert_user_error
from jepa_cli.data import store

pytestmark = pytest.mark.slow

# What each modality's run trains on: the objective and the recipe `jepa train` uses here, and a
# dataset the recipe takes (layout, inputs, extra attributes).
RUNS = {"image": ("ijepa", "builtin:ijepa-digits-tiny"), "audio": ("audio-jepa", "builtin:audio-jepa-tones-tiny"),
        "video": ("vjepa", "builtin:vjepa-moving-digits-tiny")}
DATASETS = {"image": ("NHWC", np.zeros((8, 16, 16, 1), np.uint8), {}),
            "audio": ("NS", np.zeros((8, 16000), np.float32), {"sample_rate": 16000, "seconds": 1.0}),
            "video": ("NTHWC", np.zeros((8, 16, 32, 32, 1), np.uint8), {"frames": 16})}
PAIRS = [(run, data) for run, data in itertools.product(RUNS, DATASETS) if run != data]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A labelled dataset of each modality, and for each modality a run folder with what `load_run`
    hands back for it: the recipe's objective, freshly initialised (no checkpoint)."""
    import jax

    from jepa_cli.objectives import make_objective
    from jepa_cli.training.config import load_toml

    root = tmp_path_factory.mktemp("modalities")
    datasets, runs = {}, {}
    for modality, (layout, inputs, extra) in DATASETS.items():
        path = root / f"{modality}.zarr"
        store.write_group(path, store.base_attributes("dataset", modality=modality, layout=layout,
                                                      class_names=["a", "b"], **extra))
        store.write_array(path / "inputs", inputs)
        store.write_array(path / "labels", np.arange(len(inputs), dtype=np.int32) % 2)
        datasets[modality] = path
    for modality, (name, recipe) in RUNS.items():
        config = load_toml(recipe)["objective_config"]
        objective = make_objective(name, config)
        run = root / f"run-{modality}"
        run.mkdir()
        (run / "run.json").write_text("{}")
        host = {"ema": objective.init(jax.random.key(0))["encoder"], "params": {}}
        runs[str(run)] = ({"objective": name, "objective_config": config}, objective, host, 0)
    return root, datasets, runs


@pytest.mark.parametrize("command", ["encode-latents", "probe --run", "fd --run", "train --probe-data"])
@pytest.mark.parametrize("run_modality, data_modality", PAIRS)
def test_a_dataset_of_another_modality_than_the_run_is_refused_naming_both(world, run_cli, monkeypatch, command,
                                                                           run_modality, data_modality):
    from jepa_cli.training import run as run_module

    root, datasets, runs = world
    monkeypatch.setattr(run_module, "load_run", lambda run_dir, step=None, on_fallback=None: runs[str(run_dir)])
    run, data = root / f"run-{run_modality}", datasets[data_modality]
    name, recipe = RUNS[run_modality]
    args = {"encode-latents": ["encode-latents", run, data, "-o", root / "out.zarr"],
            "probe --run": ["probe", "knn", data, data, "--run", run],
            "fd --run": ["fd", data, data, "--run", run],
            "train --probe-data": ["train", "--config", recipe, "--data", datasets[run_modality], "--out",
                                   root / "out-run", "--steps", "1", "--batch-size", "8", "--probe-every", "1",
                                   "--probe-data", f"{data},{data}"]}[command]
    before = sorted(p.name for p in root.iterdir())
    encoder = f"{run} (objective {name!r})" if command != "train --probe-data" else f"objective {name!r}"
    assert_user_error(run_cli(*args), f"{data} holds {data_modality} samples, but {encoder} encodes "
                                      f"{run_modality} samples")
    assert sorted(p.name for p in root.iterdir()) == before
