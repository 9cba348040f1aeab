"""Speed levers that must not change the numbers: the attention kernel (`attention_impl`) and the
predictor's target sets in one batched call, each against the plain float32 path on the CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jepa_cli.errors import InputError
from jepa_cli.models import ModelConfig, to_pure

TINY = dict(model="tiny", width=32, depth=2, heads=4, patch_size=4, image_size=16, pred_depth=2, pred_width=32)
# one compiled program per call shape instead of running the modules op by op (each op a dispatch)
run = nnx.jit(lambda module, *args: module(*args))


def _masks(b=2, m=3, k=9, t=5, seed=0):
    """Context and target indices of a 4x4 grid with some invalid (padded) slots."""
    rng = np.random.default_rng(seed)
    ctx = np.stack([rng.permutation(16)[:k] for _ in range(b)])
    ctx_valid = np.arange(k)[None] < np.array([k, k - 3])[:, None]
    tgt = np.stack([[rng.permutation(16)[:t] for _ in range(m)] for _ in range(b)])
    tgt_valid = np.broadcast_to(np.arange(t) < t - 1, (b, m, t)).copy()
    return jnp.asarray(ctx), jnp.asarray(ctx_valid), jnp.asarray(tgt), jnp.asarray(tgt_valid)


def test_dot_product_attention_equals_the_xla_attention_to_1e_5_on_encoder_and_predictor():
    images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
    ctx, ctx_valid, tgt, tgt_valid = _masks()
    outputs = {}
    for impl in ("xla", "dot_product"):
        config = ModelConfig(**TINY, attention_impl=impl)
        encoder, predictor = config.encoder(nnx.Rngs(0)), config.predictor(nnx.Rngs(1))
        z = run(encoder, images, ctx, ctx_valid)
        outputs[impl] = (run(encoder, images), z, run(predictor, z, ctx, ctx_valid, tgt, tgt_valid))
    valid = np.asarray(ctx_valid)[..., None]
    for (xla, fused), where in zip(zip(outputs["xla"], outputs["dot_product"]), (True, valid, True)):
        np.testing.assert_allclose(np.where(where, fused, 0), np.where(where, xla, 0), atol=1e-5, rtol=0)
    # the parameters are the same whichever kernel runs them
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()),
                                     to_pure(ModelConfig(**TINY).encoder(nnx.Rngs(0))),
                                     to_pure(ModelConfig(**TINY, attention_impl="dot_product").encoder(nnx.Rngs(0)))))


def test_dot_product_attention_gives_the_ijepa_loss_and_gradients_of_the_xla_attention_to_1e_5():
    from jepa_cli.objectives.ijepa import IJEPAObjective
    from jepa_cli.objectives.ijepa_config import IJEPAConfig

    images = jax.random.normal(jax.random.key(1), (2, 32, 32, 3))
    results = []
    for impl in ("xla", "dot_product"):
        obj = IJEPAObjective(IJEPAConfig(**{**TINY, "image_size": 32}, total_updates=10, attention_impl=impl))
        params = obj.init(jax.random.key(0))
        loss = lambda p: obj.loss(p, p["encoder"], {"image": images}, jax.random.key(2), jnp.int32(0))[0]  # noqa: E731
        results.append(jax.jit(jax.value_and_grad(loss))(params))
    (l1, g1), (l2, g2) = results
    assert abs(float(l1) - float(l2)) < 1e-5
    jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a, atol=1e-5, rtol=0), g1, g2)


def test_the_predictor_runs_every_target_set_in_one_call_equal_to_one_call_per_set():
    config = ModelConfig(**TINY)
    predictor = config.predictor(nnx.Rngs(1))
    z = jax.random.normal(jax.random.key(3), (2, 9, 32))
    ctx, ctx_valid, tgt, tgt_valid = _masks()
    batched = run(predictor, z, ctx, ctx_valid, tgt, tgt_valid)  # [B, M, T, D]
    for i in range(tgt.shape[1]):
        one = run(predictor, z, ctx, ctx_valid, tgt[:, i:i + 1], tgt_valid[:, i:i + 1])
        np.testing.assert_allclose(batched[:, i:i + 1], one, atol=1e-5, rtol=0)


def test_an_unknown_attention_impl_is_an_input_error():
    with pytest.raises(InputError, match="unknown attention_impl 'flash'"):
        ModelConfig(**TINY, attention_impl="flash")


def test_the_fused_kernels_even_length_bias_gives_the_plain_masked_attention_to_1e_6():
    # cuDNN's path (a [N, 1, L', L'] bias over an even length), run by XLA here: an odd 7-token
    # sequence with two masked keys gets one masked slot more and the same outputs
    from jepa_cli.models.block import fused_attention

    q, k, v = jax.random.normal(jax.random.key(2), (3, 2, 7, 4, 8))
    key_valid = jnp.asarray(np.arange(7)[None] < np.array([7, 5])[:, None])
    plain = fused_attention(q, k, v, key_valid, None)
    padded = fused_attention(q, k, v, key_valid, "xla")
    assert padded.shape == plain.shape == (2, 7, 4, 8)
    np.testing.assert_allclose(padded, plain, atol=1e-6, rtol=0)


def test_the_fused_kernel_is_xlas_on_the_cpu():
    from jepa_cli.models.block import fused_kernel

    assert fused_kernel(jnp.zeros((1, 4, 2, 64), jnp.bfloat16)) is None


def test_the_fused_kernel_refused_at_trace_time_falls_back_to_xlas_attention():
    # cuDNN is not there on the CPU: jax refuses it while tracing, and XLA's attention answers instead
    from jepa_cli.models.block import fused_attention

    q, k, v = jax.random.normal(jax.random.key(3), (3, 2, 6, 2, 8))
    key_valid = jnp.asarray(np.arange(6)[None] < np.array([6, 4])[:, None])
    np.testing.assert_allclose(fused_attention(q, k, v, key_valid, "cudnn"),
                               fused_attention(q, k, v, key_valid, None), atol=1e-6, rtol=0)
