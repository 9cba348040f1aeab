"""The V-JEPA objective: tubelet encoder, 3D position embedding, per-mask-type prediction, the recipes."""

import json
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_user_error
from jepa_cli.data import transforms
from jepa_cli.errors import InputError
from jepa_cli.models.vit import gather_tokens, pos_embed
from jepa_cli.objectives import VJEPAConfig, VJEPAObjective, make_objective
from jepa_cli.objectives.ijepa import layer_norm_no_affine
from jepa_cli.objectives.vjepa import l1_pair_loss

RECIPES = Path(__file__).resolve().parent.parent / "jepa_cli" / "recipes"
# clips of 4 frames of 8x8x3, tubelet 2 x 4 x 4 -> a 2 x 2 x 2 grid of 8 tokens (frame-major)
# (masks: two types of one block, sized to fit a 2x2 grid; the sampler itself is tested in test_masks.py)
TINY = dict(model="tiny", width=24, depth=1, heads=2, patch_size=4, image_size=8, channels=3, num_frames=4,
            tubelet_size=2, pred_depth=1, pred_width=16, total_updates=100, npred=[1, 1],
            pred_scale=[[0.25, 0.25], [0.5, 0.5]])


def hand_masks(key, b):
    """Two mask types (C == M == 2): context 0 = tokens {0, 1}, context 1 = {2, 3, (pad)}; target set 0
    = {4, 5, 6} (one slot padded), target set 1 = {4}."""
    ci = jnp.array([[0, 1, 0], [2, 3, 0]], jnp.int32)
    cv = jnp.array([[True, True, False], [True, True, False]])
    ti = jnp.array([[4, 5, 6, 0], [4, 0, 0, 0]], jnp.int32)
    tv = jnp.array([[True, True, True, False], [True, False, False, False]])
    tile = lambda x: jnp.broadcast_to(x, (b, *x.shape))  # noqa: E731
    return SimpleNamespace(context_index=tile(ci), context_valid=tile(cv), target_index=tile(ti),
                           target_valid=tile(tv))


@pytest.fixture(scope="module")
def setup():
    obj = VJEPAObjective(VJEPAConfig.from_dict(TINY))
    obj.sample_masks = hand_masks
    params = obj.init(jax.random.key(0))
    clips = jax.random.normal(jax.random.key(1), (2, 4, 8, 8, 3))
    return obj, params, clips


@pytest.mark.slow
def test_patchify_is_the_tubelet_convolution(setup):
    obj, params, _ = setup
    enc = obj.encoder(params["encoder"])
    clips = jax.random.normal(jax.random.key(3), (2, 4, 8, 8, 3))
    conv = jax.lax.conv_general_dilated(clips, enc.patch_embed.kernel[...], (2, 4, 4), "VALID",
                                        dimension_numbers=("NDHWC", "DHWIO", "NDHWC")) + enc.patch_embed.bias[...]
    assert enc.patch_embed.kernel.shape == (2, 4, 4, 3, 24)
    np.testing.assert_allclose(enc.patchify(clips), conv.reshape(2, 8, 24), atol=1e-5)


def test_3d_position_embedding_gives_each_axis_a_third_of_the_features():
    pos = pos_embed(48, (2, 2, 2))  # tokens (frame, row, column) frame-major; 16 features per axis
    changed = lambda a, b: np.flatnonzero(np.abs(pos[a] - pos[b]) > 1e-6)  # noqa: E731
    assert set(changed(4, 0)) <= set(range(0, 16)) and len(changed(4, 0)) > 0  # next frame
    assert set(changed(2, 0)) <= set(range(16, 32)) and len(changed(2, 0)) > 0  # next row
    assert set(changed(1, 0)) <= set(range(32, 48)) and len(changed(1, 0)) > 0  # next column


def test_a_tubelet_that_does_not_divide_the_frames_is_refused():
    with pytest.raises(InputError, match="tubelet depth 2 does not divide 5 frames"):
        make_objective("vjepa", {**TINY, "num_frames": 5})


@pytest.fixture(scope="module")
def computed(setup):
    """One compile: the loss, its gradient, and the same quantities built by hand from the modules."""
    obj, params, clips = setup
    m = hand_masks(None, 2)
    changed = clips.at[:, 0:2, 4:8, 0:4].add(100.0)  # token 2 (frames 0-1, rows 4-7, columns 0-3): context 1 only

    def predict(x):
        z_ctx = obj.encoder(params["encoder"])(x, m.context_index, m.context_valid)
        return obj.predictor(params["predictor"])(z_ctx, m.context_index, m.context_valid, m.target_index,
                                                  m.target_valid)

    def everything(p):
        loss = lambda q: obj.loss(q, p["encoder"], {"video": clips}, jax.random.key(2), jnp.int32(0))  # noqa: E731
        (value, aux), grads = jax.value_and_grad(loss, has_aux=True)(p)
        h = gather_tokens(layer_norm_no_affine(obj.encoder(p["encoder"])(clips)), m.target_index)
        return value, aux, grads, h, predict(clips), predict(changed)

    return jax.tree.map(np.asarray, jax.jit(everything)(params))


@pytest.mark.slow
def test_one_zero_initialised_mask_token_per_mask_type(setup):
    obj, params, _ = setup
    assert params["predictor"]["mask_tokens"].shape == (2, 1, 16)
    assert float(jnp.abs(params["predictor"]["mask_tokens"]).max()) == 0.0
    assert obj.modalities == ("video",)


@pytest.mark.slow
def test_loss_is_l1_on_layer_normed_targets_averaged_over_mask_types(computed):
    value, aux, _, h, z, _ = computed
    per_token = np.abs(z - h).mean(-1)  # [B, 2 types, 4 slots]
    type0 = per_token[:, 0, :3].mean()  # 3 valid slots
    type1 = per_token[:, 1, 0].mean()  # 1 valid slot
    np.testing.assert_allclose(value, (type0 + type1) / 2, rtol=1e-5)
    pooled = (per_token[:, 0, :3].sum() + per_token[:, 1, 0].sum()) / 8  # one mean over every target token
    assert abs(float(value) - float(pooled)) > 1e-4
    assert float(aux["target_tokens"]) == 2.0 and float(aux["context_tokens"]) == 2.0


def test_l1_pair_loss_hand_values():
    pred = jnp.zeros((1, 2, 3, 2))
    target = jnp.stack([jnp.ones((3, 2)), 2 * jnp.ones((3, 2))])[None]
    valid = jnp.array([[[True, False, False], [True, True, True]]])
    assert float(l1_pair_loss(pred, target, valid, 1.0)) == pytest.approx(1.5)  # (1 + 2) / 2, not 7 / 4
    assert float(l1_pair_loss(pred, target, valid, 2.0)) == pytest.approx((0.5 + 2.0) / 2)


@pytest.mark.slow
def test_each_context_predicts_its_own_target_set(computed):
    _, _, _, _, before, after = computed
    np.testing.assert_array_equal(after[:, 0], before[:, 0])  # context 0 never saw the change
    assert float(np.abs(after[:, 1] - before[:, 1]).max()) > 1e-5  # context 1 did (small: fresh weights)


@pytest.mark.slow
def test_gradient_reaches_both_mask_tokens_encoder_and_predictor(computed):
    grads = computed[2]
    tokens = grads["predictor"]["mask_tokens"]
    assert np.abs(tokens[0]).max() > 0 and np.abs(tokens[1]).max() > 0
    assert not np.allclose(tokens[0], tokens[1])
    assert np.abs(grads["encoder"]["patch_embed"]["kernel"]).max() > 0


def test_dataset_options_take_frames_size_and_channels_from_clips():
    assert VJEPAObjective.dataset_options({"modality": "video", "shape": [16, 32, 32, 1]}) == {
        "num_frames": 16, "channels": 1, "image_size": 32}
    assert VJEPAObjective.dataset_options({"modality": "video", "shape": [8, 24, 32, 3]})["image_size"] == [24, 32]


def test_crop_and_flip_are_the_same_for_every_frame_of_a_clip():
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 255, (12, 16, 3), np.uint8)
    clip = np.stack([frame] * 4)
    flipped = 0
    for seed in range(12):
        out = transforms.clip_random_resized_crop(8)({"video": clip}, np.random.default_rng(seed))["video"]
        plain = transforms.clip_random_resized_crop(8, hflip=False)({"video": clip}, np.random.default_rng(seed))["video"]
        assert out.shape == (4, 8, 8, 3) and out.dtype == np.float32
        assert all(np.array_equal(out[0], out[t]) for t in range(4))
        if np.array_equal(out, plain[:, :, ::-1]) and not np.array_equal(out, plain):
            flipped += 1
        else:
            assert np.array_equal(out, plain)
    assert 0 < flipped < 12


def test_a_clip_normalised_on_the_device_is_the_host_transforms_clip_to_one_rounding():
    clip = np.random.default_rng(4).integers(0, 256, (4, 12, 10, 3), np.uint8)
    host = transforms.clip_random_resized_crop(8)
    device = transforms.clip_random_resized_crop(8, on_device=True)
    for seed in range(3):
        pixels = device({"video": clip}, np.random.default_rng(seed))["video"]
        assert pixels.dtype == np.uint8 and pixels.shape == (4, 8, 8, 3)
        normalised = jax.jit(device.device)({"video": jnp.asarray(pixels[None])})["video"][0]
        expected = host({"video": clip}, np.random.default_rng(seed))["video"]
        # XLA:CPU divides by a reciprocal multiply: within one unit in the last place of NumPy's quotient
        np.testing.assert_array_max_ulp(np.asarray(normalised), expected, maxulp=1)


@pytest.mark.slow
def test_clips_of_other_frames_or_channels_are_refused(setup):
    obj, _, _ = setup
    with pytest.raises(InputError, match="the model takes 4 frames of 3 channel"):
        obj.eval_transform()({"video": np.zeros((6, 8, 8, 3), np.uint8)})


def test_vitl16_recipe_holds_the_official_values():
    from jepa_cli.training.config import load_toml

    raw = load_toml(RECIPES / "vjepa-vitl16.toml")
    assert (raw["steps"], raw["ipe_scale"], raw["warmup_steps"], raw["batch_size"]) == (90000, 1.25, 12000, 3072)
    assert (raw["start_lr"], raw["lr"], raw["final_lr"], raw["wd"], raw["final_wd"]) == (2e-4, 6.25e-4, 1e-6, 0.04, 0.4)
    assert (raw["clip_grad"], raw["clip_grad_start"], raw["betas"]) == (10.0, 12300, [0.9, 0.999])
    cfg = VJEPAConfig.from_dict(raw["objective_config"])
    assert (cfg.embed_dim, cfg.encoder_depth, cfg.grid3d, cfg.pred_depth, cfg.pred_width) == (1024, 24, (8, 14, 14), 12, 384)
    assert (cfg.ema, cfg.loss_exp, cfg.crop_scale, cfg.crop_ratio) == ((0.998, 1.0), 1.0, (0.3, 1.0), (0.75, 1.35))
    mask = cfg.mask_config
    assert (mask.npred, mask.pred_scale, mask.temporal_scale, mask.aspect) == (
        (8, 2), ((0.15, 0.15), (0.7, 0.7)), ((1.0, 1.0), (1.0, 1.0)), (0.75, 1.5))


def test_clipping_starts_at_clip_grad_start():
    from jepa_cli.training.optimizer import clip_by_global_norm_from

    tx = clip_by_global_norm_from(1.0, 2)
    grads = {"w": jnp.full((4,), 5.0)}  # norm 10
    state = tx.init(grads)
    norms = []
    for _ in range(3):
        out, state = tx.update(grads, state)
        norms.append(float(jnp.linalg.norm(out["w"])))
    assert norms == pytest.approx([10.0, 10.0, 1.0])


# -- the commands, end to end on builtin:moving-digits -----------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from click.testing import CliRunner

    from jepa_cli.cli.main import cli

    root = tmp_path_factory.mktemp("vjepa")
    run = lambda *a: CliRunner().invoke(cli, [str(x) for x in a], catch_exceptions=False)  # noqa: E731
    data = root / "md.zarr"
    assert run("ingest", "builtin:moving-digits", data, "--limit", "16", "-q").exit_code == 0
    recipe = (RECIPES / "vjepa-moving-digits-tiny.toml").read_text()  # the tiny recipe, one 32-wide block
    for key, value in (("depth", 1), ("width", 32), ("pred_depth", 1), ("pred_width", 16)):
        recipe = recipe.replace(f"\n{key} = ", f"\n{key} = {value}  # ")
    recipe += "context_size = 32\n"  # set: deriving K samples 32 probe batches first (5 s)
    (root / "recipe.toml").write_text(recipe)
    result = run("train", "--config", root / "recipe.toml", "--data", data, "--out", root / "run",
                 "--steps", "1", "--batch-size", "8", "--mesh", "data=1", "-q")
    assert result.exit_code == 0, result.output
    return root, data


@pytest.mark.slow
def test_tiny_recipe_trains_on_moving_digits(trained):
    root, _ = trained
    record = json.loads((root / "run" / "run.json").read_text())
    assert record["status"] == "finished"
    cfg = record["config"]["objective_config"]
    assert (cfg["num_frames"], cfg["channels"], cfg["image_size"], cfg["tubelet_size"]) == (16, 1, 32, 4)
    rows = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["step"] == 1 and np.isfinite(rows[0]["loss"])


@pytest.mark.slow
def test_encode_latents_on_video_mean_and_token_grid_then_attentive_probe(trained, run_cli):
    from jepa_cli.data.store import read_array

    root, data = trained
    mean, grid = root / "mean.zarr", root / "grid.zarr"
    result = run_cli("encode-latents", root / "run", data, "-o", mean, "--mesh", "data=1", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["shape"] == [16, 32]  # one vector per clip
    result = run_cli("encode-latents", root / "run", data, "-o", grid, "--pool", "none", "--mesh", "data=1", "--json")
    assert json.loads(result.stdout)["shape"] == [16, 64, 32]  # 4 x 4 x 4 tubelets of width 32
    np.testing.assert_allclose(read_array(mean / "inputs"), read_array(grid / "inputs").mean(axis=1), atol=1e-5)
    probe = run_cli("probe", "attentive", grid, grid, "--epochs", "1", "--batch-size", "8", "--json")
    assert probe.exit_code == 0, probe.stderr
    out = json.loads(probe.stdout)
    assert (out["n_train"], out["dim"], out["num_classes"]) == (16, 32, 10)  # 64 tokens of 32, not flattened


@pytest.mark.slow
def test_an_image_dataset_is_refused_by_vjepa(run_cli, tmp_path):
    data = tmp_path / "digits.zarr"
    assert run_cli("ingest", "builtin:digits", data, "--limit", "8", "-q").exit_code == 0
    result = run_cli("train", "--objective", "vjepa", "--data", data, "--out", tmp_path / "run", "--steps", "1",
                     "--batch-size", "8")
    assert_user_error(result, "modality is 'image'", "'vjepa' trains on 'video'")
    assert not (tmp_path / "run").exists()
