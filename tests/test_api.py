"""jepa_cli.api, called as a user would from a notebook: load_run(...).encode gives encode-latents'
numbers on the same run and data; load_dataset gives a dataset's arrays; bad input is an InputError
of one line."""

from __future__ import annotations

import numpy as np
import pytest

from test_encode import image_dataset
from test_export import OFFICIAL, TINY, _cli

from jepa_cli import api

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A run imported from the official tiny checkpoint (context and target encoders differ), a
    32 px RGB dataset of 6 images, and what encode-latents writes for it."""
    root = tmp_path_factory.mktemp("api")
    run, data = root / "run", image_dataset(root / "data.zarr", n=6, size=32, channels=3)
    assert _cli("import-checkpoint", OFFICIAL, "-o", run, *TINY, "-q").exit_code == 0
    result = _cli("encode-latents", run, data, "-o", root / "emb.zarr", "-q")
    assert result.exit_code == 0, result.stderr
    return run, data, root / "emb.zarr"


def test_encode_equals_encode_latents_on_the_same_run_and_data(setup):
    run_dir, data_dir, emb_dir = setup
    run = api.load_run(run_dir)
    z = run.encode(api.load_dataset(data_dir).inputs)
    written = api.load_dataset(emb_dir).inputs
    assert z.shape == (6, 64) and z.dtype == np.float32
    assert np.array_equal(z, written)


def _official_vit(weights, images, heads=4, patch=4, eps=1e-6):
    """The official I-JEPA VisionTransformer's tokens [N, T, D] for normalised images [N, H, W, C], in
    float64 NumPy from its PyTorch state dict (module.-prefixed): patch Conv2d, pos_embed, pre-norm blocks
    (LayerNorm, attention with qkv bias, exact-GELU MLP), final LayerNorm."""
    from scipy.special import erf

    p = {k.removeprefix("module."): np.asarray(v, np.float64) for k, v in weights.items()}

    def norm(x, name):
        return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * p[f"{name}.weight"] + \
            p[f"{name}.bias"]

    def linear(x, name):
        return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]

    n, h, w, c = images.shape
    patches = images.reshape(n, h // patch, patch, w // patch, patch, c).transpose(0, 1, 3, 5, 2, 4)
    x = patches.reshape(n, -1, c * patch * patch) @ p["patch_embed.proj.weight"].reshape(-1, c * patch * patch).T
    x = x + p["patch_embed.proj.bias"] + p["pos_embed"][0]
    d = x.shape[-1]
    depth = 1 + max(int(k.split(".")[1]) for k in p if k.startswith("blocks."))
    for i in range(depth):
        q, k, v = linear(norm(x, f"blocks.{i}.norm1"), f"blocks.{i}.attn.qkv").reshape(
            n, -1, 3, heads, d // heads).transpose(2, 0, 3, 1, 4)
        a = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // heads)
        a = np.exp(a - a.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = x + linear((a @ v).transpose(0, 2, 1, 3).reshape(n, -1, d), f"blocks.{i}.attn.proj")
        y = linear(norm(x, f"blocks.{i}.norm2"), f"blocks.{i}.mlp.fc1")
        x = x + linear(0.5 * y * (1.0 + erf(y / np.sqrt(2.0))), f"blocks.{i}.mlp.fc2")
    return norm(x, "norm")


def test_encode_of_plain_colour_images_is_the_official_vit_forward_computed_by_hand(setup):
    from jepa_cli.models.torch_checkpoint import read_torch_checkpoint

    # a plain colour survives the evaluation resize and crop unchanged, so the encoder's input is
    # (colour / 255 - mean) / std at every pixel; the embedding is the mean of the official model's tokens
    colours = np.array([[200, 30, 90], [0, 255, 128]], np.uint8)
    images = np.broadcast_to(colours[:, None, None, :], (2, 32, 32, 3)).copy()
    normalised = (images / 255.0 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    expected = _official_vit(read_torch_checkpoint(OFFICIAL)["target_encoder"], normalised).mean(axis=1)
    z = api.load_run(setup[0]).encode(images)
    assert z.shape == (2, 64) and np.abs(expected).max() > 1.0
    np.testing.assert_allclose(z, expected, rtol=0, atol=1e-5)


def test_encode_tokens_of_the_context_encoder_equal_encode_latents_with_those_options(setup, tmp_path):
    run_dir, data_dir, _ = setup
    result = _cli("encode-latents", run_dir, data_dir, "-o", tmp_path / "tok.zarr", "--pool", "none", "--weights",
                  "context", "-q")
    assert result.exit_code == 0, result.stderr
    z = api.load_run(run_dir, weights="context").encode(api.load_dataset(data_dir).inputs, pool="none")
    assert z.shape == (6, 64, 64)  # 8 x 8 patches of width 64
    np.testing.assert_allclose(z, api.load_dataset(tmp_path / "tok.zarr").inputs, rtol=0, atol=1e-6)


def test_the_run_exposes_its_config_step_and_both_encoders(setup):
    run_dir, _, _ = setup
    target, context = api.load_run(run_dir), api.load_run(run_dir, weights="context")
    assert (target.objective, target.step, target.weights) == ("ijepa", 30, "target")
    assert target.config["objective_config"]["pred_width"] == 32
    assert target.encoder_params is target.params["ema"]
    assert context.encoder_params is context.params["params"]["encoder"]
    kernel = ["blocks", "0", "attn", "qkv", "kernel"]
    a, b = target.encoder_params, context.encoder_params
    for key in kernel:
        a, b = a[key], b[key]
    assert a.shape == (64, 192) and not np.array_equal(a, b)


def test_load_dataset_gives_the_inputs_labels_and_attributes(setup):
    _, data_dir, _ = setup
    data = api.load_dataset(data_dir)
    assert data.inputs.shape == (6, 32, 32, 3) and data.inputs.dtype == np.uint8
    assert data.labels.tolist() == [0, 1, 2, 0, 1, 2]
    assert (data.modality, data.class_names, len(data)) == ("image", ["a", "b", "c"], 6)


def _one_line(error: Exception, *fragments: str) -> None:
    message = str(error)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


@pytest.mark.parametrize("call, fragments", [
    (lambda run, data, tmp: api.load_run(tmp / "missing"), ["no such run"]),
    (lambda run, data, tmp: api.load_run(data), ["not a training run"]),
    (lambda run, data, tmp: api.load_run(run, step=7), ["no checkpoint at step 7", "30"]),
    (lambda run, data, tmp: api.load_run(run, weights="online"), ["target, context"]),
    (lambda run, data, tmp: api.load_dataset(tmp / "missing.zarr"), ["no such dataset"]),
    (lambda run, data, tmp: api.load_dataset(run), ["run"]),
])
def test_bad_paths_and_options_raise_one_line_input_errors(setup, tmp_path, call, fragments):
    run_dir, data_dir, _ = setup
    with pytest.raises(api.InputError) as caught:
        call(run_dir, data_dir, tmp_path)
    _one_line(caught.value, *fragments)


@pytest.mark.parametrize("x, options, fragments", [
    (np.zeros((2, 32, 32, 3), np.uint8), {"pool": "max"}, ["pool", "mean, none"]),
    (np.zeros((2, 32, 32, 3), np.uint8), {"layers": "last4"}, ["last_layers", "1..2"]),
    (np.zeros((2, 32, 32, 3), np.uint8), {"batch_size": 0}, ["batch_size"]),
    (np.zeros((0, 32, 32, 3), np.uint8), {}, ["no samples"]),
    (np.zeros((2, 32, 32, 1), np.uint8), {}, ["1 channel(s)", "trained on 3"]),
    (np.zeros((2, 5), np.uint8), {}, ["images must be [N, H, W, 3]", "got shape [2, 5]"]),
    (np.array(["a", "b"]), {}, ["numeric array"]),
])
def test_bad_arrays_and_options_to_encode_raise_one_line_input_errors(setup, x, options, fragments):
    run = api.load_run(setup[0])
    with pytest.raises(api.InputError) as caught:
        run.encode(x, **options)
    _one_line(caught.value, *fragments)

