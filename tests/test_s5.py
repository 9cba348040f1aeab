"""S5 blocks, mixer patterns and scan orders (tiny widths, a few tokens)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.test_util import check_grads

from jepa_cli.errors import InputError
from jepa_cli.models import ModelConfig, VisionTransformer, to_pure
from jepa_cli.models.mixer_pattern import parse_mixer
from jepa_cli.models.s5 import S5, hippo_n, linear_scan
from jepa_cli.models.scan_order import scan_permutation, scan_rank

_apply = nnx.jit(lambda module, *args: module(*args))  # one compiled call per shape
_scan = jax.jit(linear_scan, static_argnames="reverse")  # one compiled program, not op-by-op dispatch
TINY = dict(model="tiny", width=16, depth=2, heads=2, patch_size=4, image_size=16, pred_depth=2,
            pred_width=16, ssm_state=4)


def _recurrence(lam, bu, reverse=False):
    """x_k = lam * x_{k-1} + bu_k from 0, a Python loop in complex128; bu [L, N]."""
    steps = range(len(bu) - 1, -1, -1) if reverse else range(len(bu))
    x, out = np.zeros(bu.shape[1], complex), np.zeros_like(bu)
    for k in steps:
        x = lam * x + bu[k]
        out[k] = x
    return out


def _complex(rng, *shape):
    return rng.normal(size=shape) + 1j * rng.normal(size=shape)


def test_ssm_step_is_the_range_of_the_initial_steps_of_every_s5_block():
    encoder = ModelConfig(**{**TINY, "ssm_state": 256}, mixer="s5", ssm_step=(0.05, 0.5)).encoder(nnx.Rngs(0))
    steps = np.exp(np.asarray(encoder.blocks[1].ssm.ssm.log_step[...]))  # [128]: P/2 states, log-uniform
    assert steps.shape == (128,) and 0.05 <= steps.min() < 0.06 and 0.4 < steps.max() <= 0.5
    default = np.exp(np.asarray(S5(8, 256, nnx.Rngs(0)).log_step[...]))
    assert 1e-3 <= default.min() < 2e-3 and 0.07 < default.max() <= 0.1  # S5's dt_min, dt_max


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "backward"])
def test_parallel_scan_equals_the_python_recurrence_in_float64(reverse):
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        for length in (1, 6, 33):
            lam = 0.95 * np.exp(1j * rng.uniform(-3, 3, 3))
            bu = _complex(rng, 2, length, 3)
            got = np.asarray(_scan(jnp.asarray(lam), jnp.asarray(bu), reverse=reverse))
            for b in range(2):
                np.testing.assert_allclose(got[b], _recurrence(lam, bu[b], reverse), atol=1e-6, rtol=0)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "backward"])
def test_masked_scan_is_the_scan_of_the_valid_subsequence(reverse):
    # padding slots anywhere (here random) neither add to nor decay the state
    rng = np.random.default_rng(1)
    with jax.enable_x64(True):
        for length in (9, 29):
            lam = 0.9 * np.exp(1j * rng.uniform(-3, 3, 2))
            bu = _complex(rng, 1, length, 2)
            valid = rng.random(length) < 0.6
            valid[0] = True
            got = np.asarray(_scan(jnp.asarray(lam), jnp.asarray(bu), jnp.asarray(valid[None]),
                                         reverse=reverse))[0]
            np.testing.assert_allclose(got[valid], _recurrence(lam, bu[0, valid], reverse), atol=1e-6, rtol=0)


def test_hippo_n_eigenvalues_are_conjugate_pairs_with_real_part_minus_half():
    lam, v = hippo_n(8)
    np.testing.assert_allclose(lam.real, -0.5, atol=1e-12)
    np.testing.assert_allclose(np.sort(lam.imag[:4]), np.sort(-lam.imag[4:]), atol=1e-9)
    assert (lam.imag[:4] < 0).all()
    np.testing.assert_allclose(v.conj().T @ v, np.eye(8), atol=1e-9)  # a unitary eigenbasis


def test_a_real_part_trained_to_zero_or_above_is_clipped_to_minus_1e_4_so_the_state_still_decays():
    # an update can push Re(Lambda) to 0 or above; the layer then uses -1e-4 (S5 clip_eigs), |Lambda_bar| < 1
    layer = S5(2, 6, nnx.Rngs(0))
    layer.lambda_re[...] = jnp.array([0.3, 0.0, -0.2], jnp.float32)
    lam, _ = layer.eigenvalues()
    np.testing.assert_allclose(np.asarray(lam.real), [-1e-4, -1e-4, -0.2], rtol=1e-6)
    steps = np.exp(np.asarray(layer.log_step[...], np.float64))
    lambda_bar, _ = layer.discretize()
    np.testing.assert_allclose(np.abs(np.asarray(lambda_bar)), np.exp(np.array([-1e-4, -1e-4, -0.2]) * steps), rtol=1e-6)
    assert (np.abs(np.asarray(lambda_bar)) < 1.0).all()


def test_s5_layer_gradients_match_finite_differences_in_float64():
    layer = S5(3, 4, nnx.Rngs(0))
    graphdef, state = nnx.split(layer)
    with jax.enable_x64(True):
        state64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), state)
        u = jax.random.normal(jax.random.key(1), (1, 5, 3), jnp.float64)
        valid = jnp.array([[True, True, False, True, True]])

        def f(u, state):
            return nnx.merge(graphdef, state)(u, valid)

        assert f(u, state64).dtype == jnp.float64
        check_grads(jax.jit(f), (u, state64), order=1, modes=["rev"], atol=1e-6, rtol=1e-6)


def test_elapsed_gaps_give_the_whole_sequence_with_the_hidden_inputs_zeroed_in_float64():
    # ssm_gaps elapse: a kept subsequence (with padded slots after it) at its scan places gives, at
    # those places, the layer's outputs on the whole sequence whose hidden tokens are zeros
    layer = S5(3, 6, nnx.Rngs(0))
    graphdef, state = nnx.split(layer)
    rng = np.random.default_rng(2)
    with jax.enable_x64(True):
        layer64 = nnx.merge(graphdef, jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), state))
        whole = rng.normal(size=(1, 23, 3))
        kept = np.sort(rng.choice(23, 9, replace=False))
        zeroed = np.zeros_like(whole)
        zeroed[:, kept] = whole[:, kept]
        reference = np.asarray(layer64(jnp.asarray(zeroed)))[:, kept]
        sub = np.concatenate([whole[:, kept], np.zeros((1, 3, 3))], axis=1)
        times = np.concatenate([kept, [23, 23, 23]])[None]
        valid = np.arange(12)[None] < 9
        got = np.asarray(layer64(jnp.asarray(sub), jnp.asarray(valid), jnp.asarray(times)))[:, :9]
        np.testing.assert_allclose(got, reference, atol=1e-9, rtol=0)
        # skip (no times) is another function: the hole is not there
        skipped = np.asarray(layer64(jnp.asarray(sub), jnp.asarray(valid)))[:, :9]
        assert np.abs(skipped - reference).max() > 1e-3


@pytest.mark.slow
def test_elapse_changes_nothing_without_a_hole_and_changes_a_masked_context(s5_encoder):
    elapse = ModelConfig(**{**TINY, "depth": 1}, mixer="s5", scan_order="serpentine",
                         ssm_gaps="elapse").encoder(nnx.Rngs(0))
    images = jax.random.normal(jax.random.key(1), (1, 16, 16, 3))
    whole = jnp.arange(16)[None]
    # every gap is one place: the same recurrence (to float32 rounding: the decay is computed per step)
    np.testing.assert_allclose(_apply(elapse, images, whole), _apply(s5_encoder, images, whole), atol=1e-6, rtol=0)
    assert (_apply(elapse, images) == _apply(s5_encoder, images)).all()  # the whole grid: the same program
    index = jnp.array([[1, 4, 6, 11]])
    assert np.abs(_apply(elapse, images, index) - _apply(s5_encoder, images, index)).max() > 1e-3


def test_pattern_repeats_cyclically_to_the_depth():
    assert parse_mixer("attn", 3) == ("attn", "attn", "attn")
    assert parse_mixer("s5,s5,s5,attn", 6) == ("s5", "s5", "s5", "attn", "s5", "s5")
    assert parse_mixer(" s5 , attn ", 2) == ("s5", "attn")
    cfg = ModelConfig(**{**TINY, "depth": 4, "pred_depth": 2}, mixer="s5,attn")
    assert cfg.encoder_mixers == ("s5", "attn", "s5", "attn")
    assert cfg.predictor_mixers == ("s5", "attn")


def test_pred_mixer_gives_the_predictor_its_own_pattern_under_a_3_to_1_encoder():
    cfg = ModelConfig(**{**TINY, "depth": 6, "pred_depth": 2}, mixer="s5,s5,s5,attn", pred_mixer="attn")
    assert cfg.encoder_mixers == ("s5", "s5", "s5", "attn", "s5", "s5")
    assert cfg.predictor_mixers == ("attn", "attn")
    assert set(to_pure(cfg.predictor(nnx.Rngs(0)))["blocks"]["1"]) == {"norm1", "attn", "norm2", "mlp"}
    assert ModelConfig(**TINY, pred_mixer="s5").encoder_mixers == ("attn", "attn")


@pytest.mark.parametrize("options, message", [
    ({"mixer": "mamba"}, "unknown mixer 'mamba'"),
    ({"mixer": "s5,s5,s5,attn", "depth": 4, "pred_depth": 2}, "names 4 blocks but the predictor has 2"),
    ({"pred_mixer": "s5,attn,s5"}, "names 3 blocks but the predictor has 2"),
    ({"pred_mixer": "lstm"}, "unknown mixer 'lstm'"),
    ({"mixer": ""}, "has an empty entry"),
    ({"mixer": "s5,,attn"}, "has an empty entry"),
    ({"mixer": "s5,attn,s5"}, "names 3 blocks but the encoder has 2"),
    ({"mixer": "s5,attn", "depth": 4, "pred_depth": 1}, "names 2 blocks but the predictor has 1"),
    ({"ssm_state": 0}, "ssm_state must be an even number >= 2"),
    ({"ssm_state": 5}, "ssm_state must be an even number >= 2"),
    ({"scan_order": "zigzag"}, "unknown scan_order 'zigzag'"),
    ({"ssm_gaps": "jump"}, "unknown ssm_gaps 'jump'"),
    ({"ssm_step": (0.1, 0.01)}, "ssm_step must be LO,HI with 0 < LO <= HI, got 0.1,0.01"),
    ({"ssm_step": (0.0, 0.1)}, "ssm_step must be LO,HI with 0 < LO <= HI, got 0.0,0.1"),
    ({"ssm_step": (0.01,)}, "ssm_step must be"),
])
def test_bad_mixer_options_are_one_line_input_errors(options, message):
    with pytest.raises(InputError, match=message) as err:
        ModelConfig(**{**TINY, **options})
    assert "\n" not in str(err.value)


def test_scan_orders_visit_every_cell_once_and_hilbert_steps_to_neighbours():
    assert scan_permutation((2, 3), "raster").tolist() == [0, 1, 2, 3, 4, 5]
    assert scan_permutation((2, 3), "serpentine").tolist() == [0, 1, 2, 5, 4, 3]
    # (frames, rows, columns): frame after frame, each in the 2D order
    assert scan_permutation((2, 2, 2), "serpentine").tolist() == [0, 1, 3, 2, 4, 5, 7, 6]
    hilbert = scan_permutation((8, 8), "hilbert")
    assert sorted(hilbert.tolist()) == list(range(64))
    rows, cols = np.divmod(hilbert, 8)
    assert (np.abs(np.diff(rows)) + np.abs(np.diff(cols)) == 1).all()
    assert sorted(scan_permutation((3, 5), "hilbert").tolist()) == list(range(15))
    assert (scan_permutation((3, 5), "hilbert")[scan_rank((3, 5), "hilbert")] == np.arange(15)).all()


def test_default_attn_model_is_the_plain_vit_param_for_param_and_bit_for_bit():
    cfg = ModelConfig(**TINY)
    assert cfg.mixer == "attn"
    ours = cfg.encoder(nnx.Rngs(0))
    plain = VisionTransformer(image_size=(16, 16), patch_size=4, channels=3, width=16, depth=2, heads=2,
                              rngs=nnx.Rngs(0))
    a, b = to_pure(ours), to_pure(plain)
    assert set(a["blocks"]["0"]) == {"norm1", "attn", "norm2", "mlp"}
    assert jax.tree.structure(a) == jax.tree.structure(b)
    assert all((x == y).all() for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    images = jax.random.normal(jax.random.key(1), (1, 16, 16, 3))
    assert (ours(images) == plain(images)).all()
    explicit = ModelConfig(**TINY, mixer="attn,attn").encoder(nnx.Rngs(0))
    assert (explicit(images) == plain(images)).all()


@pytest.fixture(scope="module")
def s5_encoder():
    return ModelConfig(**{**TINY, "depth": 1}, mixer="s5", scan_order="serpentine").encoder(nnx.Rngs(0))


@pytest.mark.slow
def test_s5_context_equals_the_s5_encoder_on_the_shorter_sequence(s5_encoder):
    # a context of 4 valid tokens + 2 padded slots gives the outputs of those 4 tokens alone
    images = jax.random.normal(jax.random.key(1), (1, 16, 16, 3))
    index = jnp.array([[1, 4, 6, 11, 0, 0]])
    valid = jnp.array([[True, True, True, True, False, False]])
    padded = _apply(s5_encoder, images, index, valid)[:, :4]
    alone = _apply(s5_encoder, images, index[:, :4])
    np.testing.assert_allclose(padded, alone, atol=1e-6, rtol=0)
    # the scan order decides the recurrence, not the slot order: shuffled slots, same outputs
    shuffled = _apply(s5_encoder, images, index[:, [2, 0, 3, 1]])
    np.testing.assert_allclose(shuffled, alone[:, [2, 0, 3, 1]], atol=1e-6, rtol=0)


def test_hybrid_stack_under_scan_layers_and_remat_equals_the_plain_loop():
    images = jax.random.normal(jax.random.key(1), (1, 16, 16, 3))
    cfg = dict(**{**TINY, "depth": 3, "pred_depth": 3}, mixer="s5,s5,attn")
    plain = ModelConfig(**cfg).encoder(nnx.Rngs(0))
    scanned = ModelConfig(**cfg, scan_layers=True, remat="block").encoder(nnx.Rngs(0))
    np.testing.assert_allclose(_apply(scanned, images), _apply(plain, images), atol=1e-5, rtol=0)


def test_ijepa_loss_and_gradients_are_finite_with_an_s5_attn_pattern():
    from jepa_cli.objectives import IJEPAConfig, IJEPAObjective

    obj = IJEPAObjective(IJEPAConfig(model="tiny", width=16, depth=2, heads=2, patch_size=4, image_size=32,
                                     pred_depth=2, pred_width=16, total_updates=10, mixer="s5,attn", ssm_state=4))
    params = obj.init(jax.random.key(0))
    assert set(params["encoder"]["blocks"]["0"]) == {"norm1", "ssm", "norm2", "mlp"}
    assert set(params["predictor"]["blocks"]["1"]) == {"norm1", "attn", "norm2", "mlp"}
    images = jax.random.normal(jax.random.key(1), (2, 32, 32, 3))
    loss = lambda p: obj.loss(p, p["encoder"], {"image": images}, jax.random.key(2), jnp.int32(0))[0]  # noqa: E731
    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    assert np.isfinite(float(value)) and float(value) > 0
    assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
    assert float(jnp.abs(grads["encoder"]["blocks"]["0"]["ssm"]["ssm"]["log_step"]).max()) > 0


@pytest.mark.slow
def test_a_checkpoint_of_another_mixer_pattern_is_refused_on_restore(tmp_path):
    from jepa_cli.training.checkpoint import Checkpoints

    hybrid = to_pure(ModelConfig(**TINY, mixer="s5,attn").encoder(nnx.Rngs(0)))
    attention = to_pure(ModelConfig(**TINY).encoder(nnx.Rngs(0)))
    ckpts = Checkpoints(tmp_path, async_save=False)
    ckpts.save(1, {"params": hybrid}, None, {})
    ckpts.wait()
    with pytest.raises(InputError, match="holds another model"):
        ckpts.restore(1, {"params": attention})
    ckpts.close()


def test_an_s5_dit_block_is_adaln_zero_modulated_and_the_untrained_dit_outputs_zero():
    from jepa_cli.models.dit import DiT

    dit = DiT(in_dim=4, out_dim=4, grid=(6,), width=16, depth=2, heads=2, num_classes=3, rngs=nnx.Rngs(0),
              mixers=("s5", "attn"), ssm_state=4)
    assert set(to_pure(dit)["blocks"]["0"]) == {"ssm", "mlp", "modulation"}  # DiT's norms have no affine
    x = jax.random.normal(jax.random.key(1), (2, 6, 16))
    cond = jax.random.normal(jax.random.key(2), (2, 16))
    assert (_apply(dit.blocks[0], x, None, cond) == x).all()  # zero gates: the block starts as the identity
    tokens = jax.random.normal(jax.random.key(1), (2, 6, 4))
    out = _apply(dit, tokens, jnp.array([0.1, 0.9]), jnp.array([0, 3]))
    assert out.shape == (2, 6, 4) and float(jnp.abs(out).max()) == 0.0


def test_the_s5_state_runs_in_float32_under_bfloat16_compute():
    layer = S5(4, 4, nnx.Rngs(0))
    u = jax.random.normal(jax.random.key(1), (1, 5, 4)).astype(jnp.bfloat16)
    assert _apply(layer, u).dtype == jnp.float32
    lambda_bar, b_bar = layer.discretize()
    assert lambda_bar.dtype == b_bar.dtype == jnp.complex64


def _randomise_zero_layers(dit, key):
    """Random values in a DiT's zero-initialised layers (adaLN-Zero, final projection): an untrained DiT
    outputs 0, which no mixer or order would change."""
    layers = [dit.final_proj, dit.final_modulation, *(blk.modulation for blk in dit.blocks)]
    for i, layer in enumerate(layers):
        shape = layer.zero_kernel[...].shape
        layer.zero_kernel.value = 0.1 * jax.random.normal(jax.random.fold_in(key, i), shape)


def test_the_dit_scans_a_2d_grid_in_its_scan_order():
    from jepa_cli.models.dit import DiT

    tokens = jax.random.normal(jax.random.key(1), (1, 16, 4))
    outs = {}
    for order in ("raster", "hilbert"):
        dit = DiT(in_dim=4, out_dim=4, grid=(4, 4), width=16, depth=1, heads=2, num_classes=0, rngs=nnx.Rngs(0),
                  mixers=("s5",), ssm_state=4, scan_order=order)
        _randomise_zero_layers(dit, jax.random.key(3))
        dit.blocks[0].ssm.ssm.log_step[...] = jnp.zeros((2,))  # step 1: each token's state carries far
        outs[order] = np.asarray(_apply(dit, tokens, jnp.array([0.5]), jnp.array([0])))
    assert np.abs(outs["raster"] - outs["hilbert"]).max() > 1e-4  # same parameters, another order (float noise: 1e-7)


def test_the_generative_objectives_take_the_mixer_options_for_their_dit():
    from jepa_cli.objectives.flow import FlowObjective

    obj = FlowObjective.from_config({"width": 16, "depth": 2, "heads": 2, "patch_size": 4, "image_size": 8,
                                     "mixer": "s5,attn", "ssm_state": 4, "scan_order": "serpentine"})
    params = obj.init(jax.random.key(0))
    assert [sorted(params["dit"]["blocks"][i]) for i in ("0", "1")] == [["mlp", "modulation", "ssm"],
                                                                       ["attn", "mlp", "modulation"]]
    assert params["dit"]["blocks"]["0"]["ssm"]["ssm"]["lambda_re"].shape == (2,)  # P/2 of ssm_state 4
    assert obj.to_config()["mixer"] == "s5,attn" and obj.to_config()["scan_order"] == "serpentine"


@pytest.mark.parametrize("options, message", [
    ({"mixer": "s5,mamba"}, "unknown mixer 'mamba'"),
    ({"mixer": "s5,s5,attn", "depth": 2}, "names 3 blocks but the DiT has 2"),
    ({"ssm_state": 3}, "ssm_state must be an even number"),
    ({"ssm_step": [1.0, -1.0]}, "ssm_step must be LO,HI with 0 < LO <= HI"),
    ({"modality": "latent", "latent_shape": [8], "scan_order": "hilbert"}, "applies to image grids"),
])
def test_bad_dit_mixer_options_are_one_line_input_errors(options, message):
    from jepa_cli.objectives.genconfig import FlowConfig

    with pytest.raises(InputError, match=message):
        FlowConfig.from_dict({"depth": 2, **options})


@pytest.mark.slow
def test_a_flow_run_trains_an_s5_dit_from_the_command_line_and_refuses_to_resume_with_another_pattern(tmp_path):
    from click.testing import CliRunner

    from jepa_cli.cli.main import cli
    from jepa_cli.data import store

    store.write_group(tmp_path / "d.zarr", store.base_attributes("dataset", modality="image", layout="NHWC"))
    store.write_array(tmp_path / "d.zarr" / "inputs", np.zeros((8, 8, 8, 1), np.uint8))
    (tmp_path / "flow.toml").write_text('objective = "flow"\nmesh = "data=1"\n[flow]\nwidth = 16\ndepth = 1\nheads = 2\n'
                                        'patch_size = 4\n')
    run = tmp_path / "run"
    common = ["train", "--config", str(tmp_path / "flow.toml"), "--data", str(tmp_path / "d.zarr"), "--out", str(run),
              "--batch-size", "8", "-q"]
    started = CliRunner().invoke(cli, [*common, "--steps", "1", "--mixer", "s5", "--ssm-state", "4"])
    assert started.exit_code == 0, started.output
    record = (run / "run.json").read_text()
    assert '"mixer": "s5"' in record
    info = json.loads(CliRunner().invoke(cli, ["info", str(run), "--json"]).stdout)
    assert (info["mixer"], info["ssm_state"], info["scan_order"]) == ("s5", 4, "raster")
    assert info["ssm_step"] == [1e-3, 0.1]
    resumed = CliRunner().invoke(cli, [*common, "--steps", "2", "--resume", "--mixer", "attn"])
    assert resumed.exit_code == 2
    assert "holds another model" in resumed.output and len(resumed.output.strip().splitlines()) == 1
    assert (run / "run.json").read_text() == record and sorted(p.name for p in (run / "checkpoints").iterdir()) == ["1"]


def test_weight_decay_leaves_out_s5s_b_eigenvalues_and_log_steps_and_decays_c():
    from jepa_cli.objectives.base import decay_matrices_only

    params = to_pure(ModelConfig(**TINY, mixer="s5,attn").encoder(nnx.Rngs(0)))
    mask = decay_matrices_only(params)
    assert mask["blocks"]["0"]["ssm"]["ssm"] == {"b": False, "c": True, "d": False, "lambda_im": False,
                                                 "lambda_re": False, "log_step": False}
    assert mask["blocks"]["0"]["ssm"]["proj"] == {"kernel": True, "bias": False}
    assert mask["blocks"]["1"]["attn"]["qkv"] == {"kernel": True, "bias": False}


@pytest.mark.slow
def test_import_checkpoint_takes_no_mixer_and_refuses_one_in_one_line(tmp_path):
    from click.testing import CliRunner

    from jepa_cli.cli.main import cli

    result = CliRunner().invoke(cli, ["import-checkpoint", str(tmp_path / "x.pth"), "-o", str(tmp_path / "run"),
                                      "--mixer", "s5"])
    assert result.exit_code == 2 and "No such option '--mixer'" in result.output
    assert not (tmp_path / "run").exists()
