"""ViT encoder, predictor and position embeddings (tiny configurations only)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jepa_cli.errors import InputError
from jepa_cli.models import (
    MODEL_SIZES,
    ModelConfig,
    ModuleTemplate,
    param_count,
    sincos_2d,
    sincos_3d,
)

TINY = ModelConfig(model="tiny", width=32, depth=2, heads=2, patch_size=4, image_size=16,
                   pred_depth=2, pred_width=16, channels=3)


# -- numpy restatement of the official formulas (ijepa / jepa vision_transformer.py) -------------
def _official_1d(embed_dim, pos):
    omega = np.arange(embed_dim // 2, dtype=float)
    omega /= embed_dim / 2.0
    omega = 1.0 / 10000**omega
    out = np.einsum("m,d->md", pos.reshape(-1), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def _official_2d(embed_dim, grid_size):
    grid_h = np.arange(grid_size, dtype=float)
    grid_w = np.arange(grid_size, dtype=float)
    grid = np.stack(np.meshgrid(grid_w, grid_h), axis=0).reshape([2, 1, grid_size, grid_size])
    return np.concatenate(
        [_official_1d(embed_dim // 2, grid[0]), _official_1d(embed_dim // 2, grid[1])], axis=1
    )


def _official_3d(embed_dim, grid_size, grid_depth):
    grid_d = np.arange(grid_depth, dtype=float)
    grid_h = np.arange(grid_size, dtype=float)
    grid_w = np.arange(grid_size, dtype=float)
    grid_h, grid_d, grid_w = np.meshgrid(grid_h, grid_d, grid_w)
    d = int(np.ceil(embed_dim / 6) * 2)
    emb = np.concatenate(
        [_official_1d(d, grid_d), _official_1d(d, grid_h), _official_1d(d, grid_w)], axis=1
    )
    return emb[:, :embed_dim]


def test_pos_embed_2d_matches_official_formula():
    got = sincos_2d(64, (7, 7))
    assert got.shape == (49, 64) and got.dtype == np.float32
    np.testing.assert_allclose(got, _official_2d(64, 7), atol=1e-6)
    # token (row 2, col 5) of a non-square grid: [column code | row code]
    rect = sincos_2d(32, (3, 6))
    np.testing.assert_allclose(rect[2 * 6 + 5, :16], _official_1d(16, np.array([5.0]))[0], atol=1e-6)
    np.testing.assert_allclose(rect[2 * 6 + 5, 16:], _official_1d(16, np.array([2.0]))[0], atol=1e-6)


def test_pos_embed_3d_matches_official_formula():
    got = sincos_3d(40, (3, 4, 4))
    assert got.shape == (48, 40)
    np.testing.assert_allclose(got, _official_3d(40, 4, 3), atol=1e-6)


# -- sizes -----------------------------------------------------------------------------------------
def _expected_encoder_params(d, depth, mlp_ratio, patch, channels):
    hidden = int(d * mlp_ratio)
    block = (3 * d * d + 3 * d) + (d * d + d) + (d * hidden + hidden) + (hidden * d + d) + 4 * d
    return patch * patch * channels * d + d + depth * block + 2 * d


@pytest.mark.parametrize("name", list(MODEL_SIZES))
def test_model_size_table_param_counts_and_output_shape(name):
    # the table's width / heads / mlp ratio at depth 2 (full depth is only counted for tiny and
    # base below, to keep the huge and giant graphs out of a CPU test run)
    cfg = ModelConfig(model=name, depth=2, patch_size=16, image_size=32, pred_depth=1, pred_width=48)
    size = MODEL_SIZES[name]
    tmpl = ModuleTemplate(cfg.encoder)  # abstract: nothing is allocated
    expected = _expected_encoder_params(size.width, 2, size.mlp_ratio, 16, 3)
    assert param_count(tmpl.shapes()) == expected
    x = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
    out = jax.eval_shape(lambda p, x: tmpl.merge(p)(x), tmpl.shapes(), x)
    assert out.shape == (2, 4, size.width)


def test_known_param_counts():
    assert _expected_encoder_params(192, 12, 4.0, 16, 3) == 5_486_400  # timm vit_tiny_patch16
    # ViT-B/16 of timm (86,567,656) minus cls token, learned pos-embed (197 x 768) and head
    assert param_count(ModuleTemplate(ModelConfig(model="base").encoder).shapes()) == 85_646_592
    assert {k: tuple(v) for k, v in MODEL_SIZES.items()} == {
        "tiny": (192, 12, 3, 4.0), "small": (384, 12, 6, 4.0), "base": (768, 12, 12, 4.0),
        "large": (1024, 24, 16, 4.0), "huge": (1280, 32, 16, 4.0), "giant": (1408, 40, 16, 48 / 11),
    }
    assert int(1408 * MODEL_SIZES["giant"].mlp_ratio) == 6144


def test_bad_configs_are_input_errors():
    with pytest.raises(InputError, match="unknown model size 'enormous'"):
        ModelConfig(model="enormous")
    with pytest.raises(InputError, match="not divisible by the patch size"):
        ModelConfig(image_size=30, patch_size=16)


# -- initialisation --------------------------------------------------------------------------------
def test_init_trunc_normal_std_biases_zero_layernorm_identity():
    cfg = ModelConfig(model="tiny", width=64, depth=3, heads=2, patch_size=8, image_size=32,
                      pred_depth=1, pred_width=32)
    enc = ModuleTemplate(cfg.encoder).init(jax.random.key(0))
    pred = ModuleTemplate(cfg.predictor).init(jax.random.key(1))
    weights = np.concatenate([
        np.ravel(enc["blocks"][str(i)]["mlp"]["fc1"]["kernel"]) for i in range(3)
    ] + [np.ravel(enc["patch_embed"]["kernel"])])
    assert abs(weights.std() - 0.02) < 0.0005 and abs(weights.mean()) < 0.0005
    assert np.abs(weights).max() < 0.2  # no depth rescale, no outliers
    proj = np.ravel(enc["blocks"]["2"]["mlp"]["fc2"]["kernel"])  # not divided by sqrt(2 * 3)
    assert abs(proj.std() - 0.02) < 0.0008
    assert abs(np.std(pred["mask_token"]) - 0.02) < 0.008 and pred["mask_token"].shape == (1, 1, 32)
    assert np.all(enc["blocks"]["0"]["attn"]["qkv"]["bias"] == 0)
    assert np.all(enc["patch_embed"]["bias"] == 0)
    assert np.all(enc["norm"]["scale"] == 1) and np.all(enc["norm"]["bias"] == 0)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(enc))


# -- forward ---------------------------------------------------------------------------------------
class _Jitted:
    """A template whose merged module is called under jit (eager NNX dispatch is slow on CPU)."""

    def __init__(self, tmpl):
        self.tmpl = tmpl
        self._call = jax.jit(lambda p, *a, **k: tmpl.merge(p)(*a, **k), static_argnames=("last_layers",))
        self.params = None

    def __call__(self, *args, **kwargs):
        return self._call(self.params, *args, **kwargs)


@pytest.fixture(scope="module")
def tiny():
    enc_t, pred_t = ModuleTemplate(TINY.encoder), ModuleTemplate(TINY.predictor)
    enc_p, pred_p = enc_t.init(jax.random.key(0)), pred_t.init(jax.random.key(1))
    images = jax.random.normal(jax.random.key(2), (2, 16, 16, 3))
    enc, pred = _Jitted(enc_t), _Jitted(pred_t)
    enc.params, pred.params = enc_p, pred_p
    return enc, pred, enc_p, pred_p, images


@pytest.mark.slow
def test_patchify_equals_strided_conv(tiny):
    enc_t, _, enc_p, _, images = tiny
    enc = enc_t.tmpl.merge(enc_p)
    conv = enc.patch_embed(images).reshape(2, 16, 32)
    np.testing.assert_allclose(enc.patchify(images), conv, atol=1e-5)


@pytest.mark.slow
def test_encoder_padded_tokens_do_not_change_valid_outputs(tiny):
    enc, _, _, _, images = tiny
    keep = jnp.array([[3, 4, 9, 15], [0, 1, 2, 7]], jnp.int32)
    plain = enc(images, keep)
    # pad with two slots holding index 0 and, elsewhere, different junk: valid outputs identical
    pad0 = jnp.concatenate([keep, jnp.zeros((2, 2), jnp.int32)], axis=1)
    padj = jnp.concatenate([keep, jnp.array([[11, 5], [13, 6]], jnp.int32)], axis=1)
    valid = jnp.array([[True] * 4 + [False] * 2] * 2)
    out0, outj = enc(images, pad0, valid), enc(images, padj, valid)
    assert out0.shape == (2, 6, 32)
    np.testing.assert_allclose(out0[:, :4], plain, atol=1e-5)
    np.testing.assert_allclose(outj[:, :4], plain, atol=1e-5)
    # without the validity mask the padding does change them
    assert np.abs(enc(images, pad0)[:, :4] - plain).max() > 1e-3


@pytest.mark.slow
def test_encoder_gather_after_pos_embed_and_context_axis(tiny):
    enc, _, _, _, images = tiny
    idx = jnp.array([[[5, 6, 7]], [[1, 2, 3]]], jnp.int32)  # [B, C=1, K]
    out = enc(images, idx)
    assert out.shape == (2, 1, 3, 32)
    np.testing.assert_allclose(out[:, 0], enc(images, idx[:, 0]), atol=1e-6)
    # position matters: the same patch content at another index gives another output
    swapped = jnp.concatenate([images[:, :, 4:8], images[:, :, 0:4], images[:, :, 8:]], axis=2)
    a = enc(images, jnp.array([[0, 1]] * 2))
    b = enc(swapped, jnp.array([[1, 0]] * 2))
    assert np.abs(a - b[:, ::-1]).max() > 1e-3


@pytest.mark.slow
def test_encoder_last_layers_concatenates_normed_block_outputs(tiny):
    enc, _, _, _, images = tiny
    full = enc(images)
    two = enc(images, last_layers=2)
    assert full.shape == (2, 16, 32) and two.shape == (2, 16, 64)
    np.testing.assert_allclose(two[..., 32:], full, atol=1e-6)
    # each slice is layer-normalised (scale 1, bias 0 at init): zero mean, unit variance
    np.testing.assert_allclose(np.mean(two[..., :32], -1), 0, atol=1e-5)
    np.testing.assert_allclose(np.var(two[..., :32], -1), 1, atol=1e-3)


@pytest.mark.slow
def test_predictor_shape_and_padding_invariance(tiny):
    enc, pred, _, _, images = tiny
    ctx_idx = jnp.array([[[0, 1, 2, 3]], [[4, 5, 6, 7]]], jnp.int32)
    ctx = enc(images, ctx_idx)  # [B, 1, 4, 32]
    tgt = jnp.array([[[8, 9], [12, 13], [14, 15]]] * 2, jnp.int32)  # [B, M=3, T=2]
    plain = pred(ctx, ctx_idx, None, tgt, None)
    assert plain.shape == (2, 3, 2, 32)
    # pad the context by 2 and each target set by 1 (junk values, invalid): valid outputs equal
    ctx_p = jnp.concatenate([ctx, 100.0 * jnp.ones((2, 1, 2, 32))], axis=2)
    ctx_idx_p = jnp.concatenate([ctx_idx, jnp.full((2, 1, 2), 11, jnp.int32)], axis=2)
    ctx_v = jnp.arange(6)[None, None] < 4
    ctx_v = jnp.broadcast_to(ctx_v, (2, 1, 6))
    tgt_p = jnp.concatenate([tgt, jnp.zeros((2, 3, 1), jnp.int32)], axis=2)
    tgt_v = jnp.broadcast_to(jnp.arange(3) < 2, (2, 3, 3))
    padded = pred(ctx_p, ctx_idx_p, ctx_v, tgt_p, tgt_v)
    assert padded.shape == (2, 3, 3, 32)
    np.testing.assert_allclose(padded[:, :, :2], plain, atol=1e-5)
    # target sets are predicted independently: set 0 alone gives the same outputs
    alone = pred(ctx, ctx_idx, None, tgt[:, :1], None)
    np.testing.assert_allclose(alone[:, 0], plain[:, 0], atol=1e-5)


@pytest.mark.slow
def test_bfloat16_compute_keeps_float32_params(tiny):
    _, _, enc_p, _, images = tiny
    bf = ModelConfig(**{**TINY.__dict__, "dtype": "bfloat16"})
    tmpl = ModuleTemplate(bf.encoder)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(tmpl.shapes()))
    out = jax.jit(lambda p, x: tmpl.merge(p)(x))(enc_p, images)
    ref = tiny[0](images)
    assert out.dtype == jnp.float32  # matmuls in bf16, the final LayerNorm in float32 (autocast)
    assert float(jnp.abs(out - ref).max()) < 0.01  # measured 0.0029 on outputs of magnitude up to 2.9


def test_gelu_is_the_exact_erf_gelu_with_its_exact_gradient():
    from jepa_cli.models.layers import gelu

    x = jnp.linspace(-6.0, 6.0, 1001)
    np.testing.assert_allclose(gelu(x), jax.nn.gelu(x, approximate=False), atol=2e-6)
    reference = jax.vmap(jax.grad(lambda v: jax.nn.gelu(v, approximate=False)))(x)
    np.testing.assert_allclose(jax.vmap(jax.grad(gelu))(x), reference, atol=1e-6)
    assert float(gelu(jnp.float32(1.0))) == pytest.approx(0.8413447, abs=1e-6)  # 1 * Phi(1)


def _residual_adds(jaxpr, width: int) -> list:
    """The dtypes of every add whose result is a 3-D token tensor [B, N, width]: the position
    embedding, the residual adds and the LayerNorms' (Linear bias adds run on 2-D views)."""
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "add":
            aval = eqn.outvars[0].aval
            if len(aval.shape) == 3 and aval.shape[-1] == width:
                out.append(aval.dtype)
    return out


def test_bfloat16_runs_the_residual_stream_in_float32_as_torch_autocast():
    from jepa_cli.objectives.ijepa import IJEPAConfig, IJEPAObjective

    objective = IJEPAObjective(IJEPAConfig(image_size=16, patch_size=4, channels=3, width=32, depth=2, heads=2,
                                           pred_width=16, pred_depth=1, pred_heads=2, dtype="bfloat16"))
    params = objective.init(jax.random.PRNGKey(0))
    images = jnp.zeros((2, 16, 16, 3))
    jaxpr = jax.make_jaxpr(lambda p, x: objective.encoder(p)(x))(params["encoder"], images).jaxpr
    adds = _residual_adds(jaxpr, 32)
    assert len(adds) >= 1 + 2 * 2  # at least the position embedding, then attention and MLP per block
    assert set(adds) == {jnp.dtype(jnp.float32)}  # with a bf16 residual stream 5 of them were bf16
    out = jax.eval_shape(lambda p, x: objective.encoder(p)(x), params["encoder"], images)
    assert out.dtype == jnp.float32  # the final LayerNorm runs in float32


def test_bfloat16_loss_differs_from_the_float32_loss_by_under_5_in_100000():
    from jepa_cli.objectives.ijepa import IJEPAConfig, IJEPAObjective

    shape = dict(image_size=16, patch_size=2, channels=3, width=32, depth=2, heads=2, pred_width=16, pred_depth=1,
                 pred_heads=2)
    params = IJEPAObjective(IJEPAConfig(**shape)).init(jax.random.PRNGKey(0))
    batch = {"image": jax.random.normal(jax.random.PRNGKey(1), (8, 16, 16, 3))}
    losses = {}
    for dtype in ("float32", "bfloat16"):
        objective = IJEPAObjective(IJEPAConfig(**shape, dtype=dtype))
        loss = jax.jit(objective.loss)  # one compile instead of minutes of op-by-op dispatch
        losses[dtype] = float(loss(params, params["encoder"], batch, jax.random.PRNGKey(2), jnp.int32(0))[0])
    # measured: 0.452838 (float32) vs 0.452824 (bfloat16), relative 3.1e-5; a bf16 residual stream gives 7.3e-5
    assert losses["bfloat16"] == pytest.approx(losses["float32"], rel=5e-5)


# -- how the blocks run: lax.scan and activation checkpointing ------------------------------------
SCAN_CFG = ModelConfig(model="tiny", width=32, depth=2, heads=2, patch_size=4, image_size=16,
                       pred_depth=2, pred_width=16, channels=3)


def _loss_and_grads(cfg):
    enc_t, pred_t = ModuleTemplate(cfg.encoder), ModuleTemplate(cfg.predictor)
    params = {"encoder": enc_t.init(jax.random.key(0)), "predictor": pred_t.init(jax.random.key(1))}
    images = jax.random.normal(jax.random.key(2), (2, 16, 16, 3))
    ctx = jnp.array([[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]], jnp.int32)
    tgt = jnp.array([[[12, 13]], [[14, 15]]], jnp.int32)

    def loss(p):
        z = enc_t.merge(p["encoder"])(images, ctx, last_layers=2)[..., :32]
        pred = pred_t.merge(p["predictor"])(z, ctx, None, tgt, None)
        return jnp.mean(pred ** 2)

    return jax.jit(jax.value_and_grad(loss))(params)


@functools.lru_cache(maxsize=1)
def _unrolled_loss_and_grads():
    """The reference every variant is compared with, computed once per worker (not per case)."""
    return _loss_and_grads(SCAN_CFG)


@pytest.mark.parametrize("how", [dict(scan_layers=True), dict(remat="dots"), dict(remat="block"),
                                 dict(scan_layers=True, remat="block")])
def test_scan_and_remat_change_neither_the_loss_nor_the_gradients(how):
    import dataclasses

    base_loss, base_grads = _unrolled_loss_and_grads()
    loss, grads = _loss_and_grads(dataclasses.replace(SCAN_CFG, **how))
    np.testing.assert_allclose(loss, base_loss, rtol=1e-6)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(base_grads)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-8)


def _encoder_jaxpr_size(depth: int, scan: bool) -> int:
    cfg = ModelConfig(model="tiny", width=32, depth=depth, heads=2, patch_size=4, image_size=16,
                      pred_depth=1, pred_width=16, scan_layers=scan)
    tmpl = ModuleTemplate(cfg.encoder)
    images = jax.ShapeDtypeStruct((2, 16, 16, 3), jnp.float32)
    jaxpr = jax.make_jaxpr(lambda p, x: tmpl.merge(p)(x))(tmpl.shapes(), images)
    return len(jaxpr.jaxpr.eqns)


def test_scanned_blocks_trace_one_block_whatever_the_depth():
    # unrolled: every block adds its equations; scanned: only the parameter stacks grow
    unrolled = _encoder_jaxpr_size(8, False) - _encoder_jaxpr_size(2, False)
    scanned = _encoder_jaxpr_size(8, True) - _encoder_jaxpr_size(2, True)
    assert unrolled > 100
    assert scanned <= 16  # one stack per parameter leaf of a block (16 leaves), whatever the depth


def test_unknown_remat_is_an_input_error():
    with pytest.raises(InputError, match="unknown remat 'full'"):
        ModelConfig(remat="full")


def test_templates_of_equal_configs_share_one_traced_structure():
    import dataclasses

    a = ModuleTemplate(SCAN_CFG.encoder)
    b = ModuleTemplate(dataclasses.replace(SCAN_CFG).encoder)  # equal, not identical, config
    assert a.graphdef is b.graphdef and a.abstract_state is b.abstract_state


@pytest.mark.parametrize("mixer", ["attn", "s5,attn"])
def test_a_template_has_the_structure_of_the_module_built_with_nnx_rngs(mixer):
    from flax import nnx

    cfg = ModelConfig(model="tiny", width=32, depth=2, heads=2, patch_size=4, image_size=16, pred_depth=2,
                      pred_width=16, mixer=mixer, ssm_state=4)
    for build in (cfg.encoder, cfg.predictor):
        graphdef, state = nnx.split(nnx.eval_shape(lambda: build(nnx.Rngs(0))))  # noqa: B023
        template = ModuleTemplate(build)
        assert template.graphdef == graphdef
        assert jax.tree.map(lambda a: (a.shape, a.dtype), nnx.to_pure_dict(template.abstract_state)) == \
            jax.tree.map(lambda a: (a.shape, a.dtype), nnx.to_pure_dict(state))


def test_a_template_without_init_rules_draws_the_parameters_of_nnx_rngs_bit_for_bit():
    from flax import nnx

    from jepa_cli.models.template import to_pure

    cfg = ModelConfig(model="tiny", width=32, depth=2, heads=2, patch_size=4, image_size=16, pred_depth=2,
                      pred_width=16, mixer="s5,attn", ssm_state=4)  # S5's parameters have no INIT_RULES entry
    for key in (jax.random.key(3), jax.random.PRNGKey(3)):
        ours = ModuleTemplate(cfg.encoder).init(key)
        flax_own = jax.jit(lambda k: to_pure(cfg.encoder(nnx.Rngs(params=k))))(key)
        for got, want in zip(jax.tree.leaves(ours), jax.tree.leaves(flax_own), strict=True):
            np.testing.assert_array_equal(got, want)
