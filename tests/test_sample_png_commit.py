"""`jepa sample --png` writes its picture after the dataset is moved into place (sampling/run.py): a
command stopped at the commit leaves no PNG without its dataset."""

from __future__ import annotations

import json

import pytest

from jepa_cli.data import atomic

pytestmark = pytest.mark.slow

FLOW = {"width": 16, "depth": 1, "heads": 2, "patch_size": 4, "image_size": 8, "channels": 1, "num_classes": 2,
        "modality": "image"}


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A flow run folder whose `load_run` hands back a freshly initialised 8x8 class-conditional DiT (no
    training, no checkpoint)."""
    import jax

    from jepa_cli.objectives import make_objective
    from jepa_cli.sampling import run as sampling_run

    objective = make_objective("flow", FLOW)
    params = objective.init(jax.random.key(0))
    run = tmp_path / "run"
    run.mkdir()
    config = {"objective": "flow", "objective_config": FLOW}
    (run / "run.json").write_text(json.dumps({"config": config, "lengths": {}}))
    monkeypatch.setattr(sampling_run, "load_run", lambda run_dir, step=None, on_fallback=None:
                        (config, objective, {"ema": params, "params": params}, 1))
    return run


def test_a_sample_stopped_at_the_commit_leaves_no_png(run, tmp_path, run_cli, monkeypatch):
    def stopped(tmp, final, force, kind):
        raise KeyboardInterrupt  # Ctrl-C as the dataset was about to be moved into place

    monkeypatch.setattr(atomic, "move_into_place", stopped)
    result = run_cli("sample", run, "-n", "2", "-o", tmp_path / "s.zarr", "--png", tmp_path / "s.png", "--steps", "1",
                     "--mesh", "data=1", "-q")
    assert result.exit_code == 130, result.stderr
    assert not (tmp_path / "s.png").exists() and not (tmp_path / "s.zarr").exists()


def test_the_png_follows_the_committed_dataset(run, tmp_path, run_cli):
    result = run_cli("sample", run, "-n", "2", "-o", tmp_path / "s.zarr", "--png", tmp_path / "s.png", "--steps", "1",
                     "--mesh", "data=1", "-q")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "s.zarr" / "zarr.json").exists()
    assert (tmp_path / "s.png").read_bytes().startswith(atomic.PNG_MAGIC)
