"""The pre-norm transformer block of the ViT encoder, the I-JEPA predictor and the DiT
(models/dit.py), its parts, and the stack that runs a sequence of them (Flax NNX).

As the official I-JEPA src/models/vision_transformer.py Block: LayerNorm (eps 1e-6 unless
`norm_eps` says otherwise), multi-head attention with qkv bias, LayerNorm, exact-GELU MLP. Every
Linear weight is trunc-normal(0.02) (PyTorch's ``trunc_normal_``: a normal of std 0.02 cut at +-2,
i.e. effectively untruncated), biases 0, LayerNorm (1, 0). Parameters are float32; ``dtype`` is the
compute dtype of matmuls and attention. With bfloat16 the rest is float32 as under the official
code's torch.cuda.amp.autocast: LayerNorm and the softmax (its logits are cast up), so only Linear
outputs are bf16. Attention takes ``key_valid`` bool [B, L]: invalid slots are masked out as keys.

A block mixes tokens by attention (the default) or, per block (``mixers``, option `mixer`), by a
bidirectional S5 recurrence (models/s5.py); with `cond_dim` it is DiT's adaLN-Zero block.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jepa_cli.errors import InputError
from jepa_cli.models.layers import NORM_EPS, gelu, layer_norm, linear_layer
from jepa_cli.models.mixer_pattern import ATTENTION_IMPLS, SSM_STEP


def fused_kernel(q: jax.Array) -> str | None:
    """'cudnn' where cuDNN's flash attention takes queries like `q` [N, L, H, D] (an NVIDIA GPU,
    bfloat16 or float16, head dim a multiple of 8 up to 128), else None: XLA's attention."""
    device = jax.devices()[0]
    on_cuda = device.platform == "gpu" and "cuda" in getattr(device.client, "platform_version", "").lower()
    head_dim = q.shape[-1]
    return "cudnn" if on_cuda and q.dtype in (jnp.bfloat16, jnp.float16) and head_dim <= 128 \
        and head_dim % 8 == 0 else None


def fused_attention(q, k, v, key_valid, implementation: str | None):
    """softmax(q k^T / sqrt(D)) v by jax.nn.dot_product_attention: q, k, v [N, L, H, D], key_valid
    bool [N, L] or None; returns [N, L, H, D]. With an `implementation` named, a mask goes in as a
    [N, 1, L', L'] additive bias over an even length L' (cuDNN trains with a bias only on even
    lengths, so an odd sequence gets one masked slot more, dropped from the output). Where the kernel
    refuses when traced (shapes, cuDNN version), XLA's attention computes the same thing."""
    if implementation is None:
        mask = None if key_valid is None else key_valid[:, None, None, :]
        return jax.nn.dot_product_attention(q, k, v, mask=mask)
    n, length = q.shape[:2]
    pad = length % 2 if key_valid is not None else 0
    mask = None
    if pad:
        q, k, v = (jnp.pad(a, ((0, 0), (0, 1), (0, 0), (0, 0))) for a in (q, k, v))
        key_valid = jnp.pad(key_valid, ((0, 0), (0, 1)))
    if key_valid is not None:
        mask = jnp.broadcast_to(key_valid[:, None, None, :], (n, 1, length + pad, length + pad))
    try:
        out = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=implementation)
    except (NotImplementedError, RuntimeError, ValueError):  # the kernel refuses these shapes or this cuDNN
        out = jax.nn.dot_product_attention(q, k, v, mask=mask)
    return out[:, :length]


class Attention(nnx.Module):
    """Multi-head self-attention. `impl` (set on a built model by `use_attention`): 'xla' the einsums
    and float32 softmax written out below (the official maths); 'dot_product' jax.nn.dot_product_attention,
    with cuDNN's flash attention where `fused_kernel` says it applies and XLA's elsewhere."""

    impl = "xla"

    def __init__(self, dim: int, heads: int, dtype, rngs: nnx.Rngs):
        self.heads = heads
        self.dtype = dtype
        self.qkv = linear_layer(dim, 3 * dim, dtype, rngs)
        self.proj = linear_layer(dim, dim, dtype, rngs)

    def __call__(self, x, key_valid=None):
        n, length, dim = x.shape
        hd = dim // self.heads
        qkv = self.qkv(x).reshape(n, length, 3, self.heads, hd)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        if self.impl == "dot_product":
            return self.proj(fused_attention(q, k, v, key_valid, fused_kernel(q)).reshape(n, length, dim))
        logits = jnp.einsum("nqhd,nkhd->nhqk", q * jnp.asarray(hd**-0.5, q.dtype), k)
        logits = logits.astype(jnp.float32)
        if key_valid is not None:
            logits = jnp.where(key_valid[:, None, None, :], logits, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
        out = jnp.einsum("nhqk,nkhd->nqhd", weights, v).reshape(n, length, dim)
        return self.proj(out)


class Mlp(nnx.Module):
    def __init__(self, dim: int, hidden: int, dtype, rngs: nnx.Rngs):
        self.fc1 = linear_layer(dim, hidden, dtype, rngs)
        self.fc2 = linear_layer(hidden, dim, dtype, rngs)

    def __call__(self, x):
        return self.fc2(gelu(self.fc1(x)))


class ZeroLinear(nnx.Module):
    """A Linear whose weights start at zero (leaf names `zero_kernel`/`zero_bias`, which
    models/template.py INIT_RULES fills with zeros): DiT's adaLN-Zero modulation and final projection."""

    def __init__(self, din: int, dout: int, dtype, rngs: nnx.Rngs):
        self.dtype = dtype
        self.zero_kernel = nnx.Param(jnp.zeros((din, dout), jnp.float32))
        self.zero_bias = nnx.Param(jnp.zeros((dout,), jnp.float32))

    def __call__(self, x):
        lead = x.shape[:-1]
        y = x.reshape(-1, x.shape[-1]).astype(self.dtype) @ self.zero_kernel[...].astype(self.dtype)
        y = y + self.zero_bias[...].astype(self.dtype)
        return y.reshape(*lead, y.shape[-1])


def modulate(x, shift, scale):
    """DiT's adaLN: x * (1 + scale) + shift, with shift/scale [B, D] broadcast over tokens."""
    return x * (1 + scale[:, None]) + shift[:, None]


class Block(nnx.Module):
    """Pre-norm transformer block. With `cond_dim` it is DiT's adaLN-Zero block (Peebles & Xie
    2023, Sec. 3.2): the norms lose their affine parameters and a zero-initialised Linear of
    SiLU(cond) gives shift/scale/gate for attention and MLP; without it (the JEPA encoder and
    predictor) it is the plain block, unchanged. `mixer` 's5' puts an S5 mixer (`ssm`, state size
    `ssm_state`) where attention (`attn`) is; the rest of the block is the same."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float, dtype, rngs: nnx.Rngs,
                 cond_dim: int | None = None, mixer: str = "attn", ssm_state: int = 64,
                 ssm_step: tuple[float, float] = SSM_STEP, norm_eps: float = NORM_EPS):
        affine = cond_dim is None
        norm = functools.partial(layer_norm, eps=norm_eps) if affine else plain_layer_norm
        self.norm1 = norm(dim, dtype, rngs)
        if mixer == "attn":
            self.attn = Attention(dim, heads, dtype, rngs)
        else:
            from jepa_cli.models.s5 import S5Mixer

            self.ssm = S5Mixer(dim, ssm_state, dtype, rngs, step=ssm_step)
        self.norm2 = norm(dim, dtype, rngs)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), dtype, rngs)
        self.modulation = None if affine else ZeroLinear(cond_dim, 6 * dim, dtype, rngs)

    def __call__(self, x, key_valid=None, cond=None, times=None):
        """times int [B, N]: the tokens' places in the whole scan, for an S5 mixer whose gaps elapse
        (models/s5.py); attention ignores them."""
        if hasattr(self, "attn"):
            mix = self.attn
        else:
            mix = functools.partial(self.ssm, times=times)
        if self.modulation is None:
            x = x + mix(self.norm1(x), key_valid)
            return x + self.mlp(self.norm2(x))
        s1, c1, g1, s2, c2, g2 = jnp.split(self.modulation(jax.nn.silu(cond)), 6, axis=-1)
        x = x + g1[:, None] * mix(modulate(self.norm1(x), s1, c1), key_valid)
        return x + g2[:, None] * self.mlp(modulate(self.norm2(x), s2, c2))


def use_attention(module: nnx.Module, impl: str) -> nnx.Module:
    """`module` with every Attention computed by `impl` ('xla' or 'dot_product', ATTENTION_IMPLS); the
    parameters are the same, so a run may change it between resumes."""
    if impl not in ATTENTION_IMPLS:
        raise InputError(f"unknown attention_impl {impl!r} (choose from {', '.join(ATTENTION_IMPLS)})")
    if impl != Attention.impl:  # the default leaves the module as built
        for _, sub in nnx.iter_graph(module):
            if isinstance(sub, Attention):
                sub.impl = impl
    return module


def block_kind(block: Block) -> str:
    """'attn' or 's5': the mixer of `block`."""
    return "attn" if hasattr(block, "attn") else "s5"


def run_blocks(blocks, x, key_valid=None, cond=None, *, scan: bool = False, remat: str = "none", times=None):
    """x [B, N, D] through ``blocks`` in order: ``for blk in blocks: x = blk(x, key_valid, cond, times)``.

    ``scan``: the blocks' parameters are stacked ([depth, ...], one copy per call) and one traced
    block runs under lax.scan, so tracing and compiling do not grow with depth. ``remat``: what the
    backward pass keeps of each block: 'none' every activation; 'dots' the matmul outputs without
    batch dimensions (the Linear layers'; attention and elementwise work is recomputed); 'block'
    only the block's input (the whole block is recomputed, as V-JEPA's use_activation_checkpointing).
    A hybrid stack runs as runs of consecutive blocks of one mixer (each scanned on its own: lax.scan
    needs one parameter structure), so s5,s5,s5,attn x 3 traces 6 blocks, not 12.
    """
    blocks = list(blocks)
    if not blocks:
        return x
    kinds = [block_kind(blk) for blk in blocks]
    if len(set(kinds)) > 1:
        start = 0
        for end in range(1, len(blocks) + 1):
            if end == len(blocks) or kinds[end] != kinds[start]:
                x = run_blocks(blocks[start:end], x, key_valid, cond, scan=scan, remat=remat, times=times)
                start = end
        return x
    if not scan and remat == "none":
        for blk in blocks:
            x = blk(x, key_valid, cond, times)
        return x
    graphdef = nnx.graphdef(blocks[0])

    def body(x, state):
        return nnx.merge(graphdef, state)(x, key_valid, cond, times)

    if remat != "none":
        policy = {"dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
                  "block": jax.checkpoint_policies.nothing_saveable}[remat]
        body = jax.checkpoint(body, policy=policy)
    states = [nnx.state(blk) for blk in blocks]
    if not scan or len(blocks) == 1:
        for state in states:
            x = body(x, state)
        return x
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *states)
    x, _ = jax.lax.scan(lambda carry, state: (body(carry, state), None), x, stacked)
    return x


def plain_layer_norm(dim, dtype, rngs):
    """LayerNorm without scale and bias (eps 1e-6), as DiT's modulated norms."""
    return nnx.LayerNorm(dim, epsilon=1e-6, use_scale=False, use_bias=False, dtype=dtype,
                         param_dtype=jnp.float32, rngs=rngs)



def make_blocks(width, heads, mlp_ratio, dtype, rngs, depth, mixers, ssm_state, ssm_step=SSM_STEP, norm_eps=NORM_EPS):
    """`depth` blocks; mixers None: all attention, the ViT's blocks in the official parameter order."""
    if mixers is None:
        return nnx.List([Block(width, heads, mlp_ratio, dtype, rngs, norm_eps=norm_eps) for _ in range(depth)])
    if len(mixers) != depth:
        raise InputError(f"{len(mixers)} mixers for {depth} blocks")
    return nnx.List([Block(width, heads, mlp_ratio, dtype, rngs, mixer=m, ssm_state=ssm_state, ssm_step=ssm_step,
                           norm_eps=norm_eps)
                     for m in mixers])
