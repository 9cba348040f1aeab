"""LeJEPA (`--objective lejepa`): the loss, the projector, the views, a tiny run through the CLI and
the refusals (tiny models only)."""

import dataclasses
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner

from jepa_cli.data import transforms
from jepa_cli.models.config import ModelConfig
from jepa_cli.objectives import IJEPAConfig, LeJEPAConfig, make_objective
from jepa_cli.objectives.lejepa import invariance, lejepa_loss, projector_apply, projector_init
from jepa_cli.objectives.sigreg import random_directions

sys.path.insert(0, str(Path(__file__).parent))
from test_encode import image_dataset  # noqa: E402

# 16x16 one-channel images, patch 4: global views 4x4 tokens, local views (8 px) 2x2
RECIPE = """
objective = "lejepa"
steps = 3
batch_size = 8
mesh = "data=1"
save_every = 3
log_every = 1
[lejepa]
width = 32
depth = 2
heads = 2
patch_size = 4
proj_dims = [32, 16]
views_local = 2
local_size = 8
sigreg_slices = 8
"""


# -- the loss ------------------------------------------------------------------------------------------

def test_invariance_is_the_mean_squared_distance_to_the_views_mean():
    proj = np.random.default_rng(0).normal(size=(3, 4, 5)).astype(np.float32)  # [V, N, K]
    total = 0.0
    for n in range(4):
        centre = [sum(proj[v, n, k] for v in range(3)) / 3 for k in range(5)]
        total += sum((proj[v, n, k] - centre[k]) ** 2 for v in range(3) for k in range(5))
    assert float(invariance(proj)) == pytest.approx(total / (3 * 4 * 5), rel=1e-5)
    # two views at 0 and 2: each is 1 from their mean
    assert float(invariance(np.array([[[0.0]], [[2.0]]]))) == pytest.approx(1.0)


def _epps_pulley(x, t_max, knots):
    """The statistic of x [N] by its definition: N x the integral over t in [-t_max, t_max] of
    |ecf(t) - exp(-t^2/2)|^2 exp(-t^2/2), by the trapezoid rule on 2 knots - 1 points."""
    t = np.linspace(-t_max, t_max, 2 * knots - 1)
    ecf = np.exp(1j * np.outer(t, x)).mean(axis=1)
    phi = np.exp(-t**2 / 2)
    f = np.abs(ecf - phi) ** 2 * phi
    return len(x) * float(np.sum((f[1:] + f[:-1]) / 2 * np.diff(t)))


def test_the_loss_is_one_minus_lambda_invariance_plus_lambda_sigreg():
    rng = np.random.default_rng(1)
    proj = rng.normal(size=(4, 32, 6)).astype(np.float64)  # [V, N, K]
    key, weight, slices, knots, t_max = jax.random.key(3), 0.3, 5, 9, 2.5
    a = np.asarray(random_directions(key, 6, slices), np.float64)  # the directions the loss draws from `key`
    sig = np.mean([_epps_pulley(proj[v] @ a[:, m], t_max, knots) for v in range(4) for m in range(slices)])
    inv = np.mean((proj - proj.mean(axis=0, keepdims=True)) ** 2)
    loss, got_inv, got_sig = lejepa_loss(jnp.asarray(proj, jnp.float32), key, weight, slices, knots, t_max)
    assert float(got_inv) == pytest.approx(inv, rel=1e-5)
    assert float(got_sig) == pytest.approx(sig, rel=1e-4)
    assert float(loss) == pytest.approx((1 - weight) * inv + weight * sig, rel=1e-4)


def test_the_projector_is_linear_batchnorm_relu_then_linear():
    params = projector_init(jax.random.key(0), (6, 5, 3))
    x = np.random.default_rng(2).normal(size=(10, 6))
    w0, b0 = (np.asarray(params["linear0"][k], np.float64) for k in ("kernel", "bias"))
    w1, b1 = (np.asarray(params["linear1"][k], np.float64) for k in ("kernel", "bias"))
    h = x @ w0 + b0
    h = (h - h.mean(axis=0)) / np.sqrt(h.var(axis=0) + 1e-5)  # BatchNorm1d in training mode, scale 1, bias 0
    want = np.maximum(h, 0) @ w1 + b1
    np.testing.assert_allclose(np.asarray(projector_apply(params, jnp.asarray(x, jnp.float32))), want,
                               rtol=1e-4, atol=1e-5)
    assert np.max(np.abs(w0)) <= 1 / np.sqrt(6)  # torch.nn.Linear's U(-1/sqrt(fan_in), 1/sqrt(fan_in))


# -- the views ------------------------------------------------------------------------------------------

def test_the_views_are_global_and_local_crops_under_their_own_keys():
    views = (transforms.ViewSpec(2, (16, 16), (0.3, 1.0)), transforms.ViewSpec(3, (8, 8), (0.05, 0.3)))
    fn = transforms.multi_view(views, ("image", "image_local"), (0.5,), (0.5,))
    image = np.random.default_rng(0).integers(0, 256, (20, 20, 1)).astype(np.uint8)
    out = fn({"image": image, "label": 2}, np.random.default_rng(0))
    assert out["image"].shape == (2, 16, 16, 1) and out["image_local"].shape == (3, 8, 8, 1)
    assert out["label"] == 2
    none = transforms.multi_view((views[0], dataclasses.replace(views[1], count=0)), ("image", "image_local"))
    assert "image_local" not in none({"image": image}, np.random.default_rng(0))


def test_a_whole_image_view_without_augmentation_is_the_normalised_image():
    fn = transforms.multi_view((transforms.ViewSpec(1, (12, 12), (1.0, 1.0)),), ("image",), (0.5,) * 3, (0.25,) * 3,
                               ratio=(1.0, 1.0), hflip=False, jitter_prob=0.0, grayscale_prob=0.0)
    image = np.random.default_rng(1).integers(0, 256, (12, 12, 3)).astype(np.uint8)
    want = (image / 255.0 - 0.5) / 0.25
    np.testing.assert_allclose(fn({"image": image}, np.random.default_rng(0))["image"][0], want, atol=1e-4)


# -- the options -----------------------------------------------------------------------------------------

def test_the_reused_options_are_declared_once_with_lejepa_s_defaults():
    mine = {f.name: f for f in dataclasses.fields(LeJEPAConfig)}
    ijepa = {f.name: f for f in dataclasses.fields(IJEPAConfig)}
    model = {f.name: f for f in dataclasses.fields(ModelConfig)}
    for name in ("sigreg_weight", "sigreg_slices", "sigreg_knots", "sigreg_t_max", "crop_scale"):
        assert mine[name].metadata == ijepa[name].metadata
    for name in ("model", "width", "depth", "heads", "patch_size", "mixer"):
        assert mine[name].metadata == model[name].metadata
    assert "lejepa" in ijepa["sigreg_weight"].metadata["applies"]
    config = LeJEPAConfig()
    assert config.sigreg_weight == 0.05  # lejepa scripts/launch_*_ablation.md bstat_lambda
    assert (config.views_global, config.views_local) == (2, 6)  # lejepa README.md
    assert (config.crop_scale, config.local_scale) == ((0.3, 1.0), (0.05, 0.3))  # lejepa README.md
    assert config.proj_dims == (2048, 2048, 128)  # lejepa MINIMAL.md
    assert "pred_depth" not in mine and "ema" not in mine


def test_the_local_views_default_to_the_reference_s_98_of_224_in_whole_patches():
    assert LeJEPAConfig(image_size=224, patch_size=14).local_size_pixels == (98, 98)
    assert LeJEPAConfig(image_size=32, patch_size=4, channels=1).local_size_pixels == (16, 16)


def test_one_encoder_no_ema_and_the_one_encoder_is_the_target():
    from jepa_cli.training.encoder import select_encoder

    objective = make_objective("lejepa", {"width": 32, "depth": 1, "heads": 2, "patch_size": 4, "image_size": 16})
    assert objective.ema_spec is None
    encoder = {"w": np.ones(2)}
    host = {"params": {"encoder": encoder, "projector": {}}, "ema": {}}
    assert select_encoder(objective, host, "target", "run") is encoder
    assert select_encoder(objective, host, "context", "run") is encoder


# -- through the CLI -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 3-update lejepa run on 24 random 16x16 images, with a checkpoint at update 3."""
    from jepa_cli.cli.main import cli

    root = tmp_path_factory.mktemp("lejepa")
    (root / "r.toml").write_text(RECIPE)
    data = image_dataset(root / "data.zarr", n=24, size=16)
    result = CliRunner().invoke(cli, ["train", "--config", str(root / "r.toml"), "--data", str(data), "--out",
                                      str(root / "run"), "-q", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return root, json.loads(result.stdout)


@pytest.mark.slow
def test_a_training_run_writes_checkpoints_and_the_loss_terms(trained):
    root, summary = trained
    assert summary["objective"] == "lejepa" and summary["checkpoints"] == [3]
    assert (root / "run" / "checkpoints" / "3").is_dir()
    rows = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "inv_loss" in r][-1]
    assert last["loss"] == pytest.approx(0.95 * last["inv_loss"] + 0.05 * last["sigreg"], rel=1e-4)


@pytest.mark.slow
def test_encode_latents_on_a_lejepa_run_gives_one_embedding_per_example(trained):
    from jepa_cli.cli.main import cli
    from jepa_cli.data import store

    root, _ = trained
    out = root / "latents.zarr"
    result = CliRunner().invoke(cli, ["encode-latents", str(root / "run"), str(root / "data.zarr"), "-o", str(out),
                                      "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    assert store.open_array(out / "inputs").shape == (24, 32)  # [N, D], D the encoder's width


@pytest.mark.slow
def test_ema_inspect_says_in_one_line_that_the_run_has_no_ema(trained):
    from jepa_cli.cli.main import cli

    root, _ = trained
    result = CliRunner().invoke(cli, ["ema-inspect", str(root / "run")])
    assert result.exit_code == 2
    assert "keeps no EMA" in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["--sigreg-weight", "1.5"], "sigreg_weight must be in [0, 1]"),
    (["--sigreg-weight", "-0.1"], "sigreg_weight must be in [0, 1]"),
    (["--sigreg-slices", "0"], "sigreg_slices must be >= 1"),
    (["--sigreg-knots", "1"], "sigreg_knots must be >= 2"),
    (["--sigreg-t-max", "0"], "sigreg_t_max must be > 0"),
    (["--views-global", "1", "--views-local", "0"], "at least 2 views"),
    (["--local-size", "20"], "local_size 20x20 is larger than the input"),
    (["--pred-depth", "2"], "unknown lejepa option 'pred_depth'"),
    (["--objective", "ijepa", "--views-local", "2"], "unknown ijepa option 'views_local'"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, trained, args, message):
    from jepa_cli.cli.main import cli

    root, _ = trained
    out = tmp_path / "run"
    recipe = [] if "--objective" in args else ["--config", str(root / "r.toml")]
    result = CliRunner().invoke(cli, ["train", *recipe, "--data", str(root / "data.zarr"), "--out", str(out),
                                      "--steps", "1", "--batch-size", "8", "-q", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()
