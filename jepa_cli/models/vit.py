"""Vision Transformer encoder and I-JEPA predictor (Flax NNX).

Follows the official I-JEPA src/models/vision_transformer.py: convolutional patchify, fixed 2D
sin-cos position embedding added before masking, no CLS token, pre-norm blocks (LayerNorm eps 1e-6 unless `norm_eps` says otherwise,
qkv bias, GELU MLP), final LayerNorm. Every Linear / Conv weight is trunc-normal(0.02) (PyTorch's
``trunc_normal_``: a normal of std 0.02 cut at +-2, i.e. effectively untruncated), biases 0,
LayerNorm (1, 0). Parameters are float32; ``dtype`` is the compute dtype of matmuls and attention.
With bfloat16 the rest is float32 as under the official code's torch.cuda.amp.autocast: the residual
stream, LayerNorm, the softmax (its logits are cast up), so only Linear/Conv outputs are bf16.

Token selection uses index form: ``index`` int [B, K] (or [B, C, K]) picks patches (raster order)
after the position embedding is added, ``valid`` bool of the same shape marks real slots; invalid
slots are masked out as attention keys, so they change nothing in the valid tokens' outputs.

Blocks mix tokens by attention (the default) or, per block (``mixers``, option `mixer`), by a
bidirectional S5 recurrence (models/s5.py). A stack with any S5 block sorts its tokens into the
scan order (models/scan_order.py) before the blocks and back after them; invalid slots go last and
the recurrence steps over them, so they change nothing in the valid tokens' outputs either.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jepa_cli.errors import InputError
from jepa_cli.models.mixer_pattern import ATTENTION_IMPLS
from jepa_cli.names import COMPUTE_DTYPES
from jepa_cli.models.pos_embed import sincos_2d, sincos_3d
from jepa_cli.models.scan_order import scan_rank


DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}  # compute dtype names -> JAX dtypes
assert tuple(DTYPES) == COMPUTE_DTYPES


def pos_embed(dim: int, grid: tuple[int, ...]):
    """Fixed sin-cos position embedding of a 2D (rows, columns) or 3D (frames, rows, columns) grid;
    3D splits the features equally over the three axes (V-JEPA vitl16.yaml: uniform_power true)."""
    return sincos_3d(dim, tuple(grid), True) if len(grid) == 3 else sincos_2d(dim, tuple(grid))


def trunc_normal(std: float = 0.02):
    """PyTorch ``trunc_normal_(std=std)`` (bounds +-2 absolute): for std 0.02 a plain normal."""

    def init(key, shape, dtype=jnp.float32):
        x = jax.random.truncated_normal(key, -2.0 / std, 2.0 / std, shape, jnp.float32)
        return (x * std).astype(dtype)

    return init


_zeros = nnx.initializers.zeros_init()


class Linear(nnx.Linear):
    """nnx.Linear applied to a 2-D view of the tokens [..., din] -> [..., dout].

    Same parameters and maths; XLA:CPU computes the weight gradient of a 2-D dot about twice as
    fast as that of a dot contracting several leading axes (benchmarks/train_step.py).
    """

    def __call__(self, x):
        lead = x.shape[:-1]
        y = super().__call__(x.reshape(-1, x.shape[-1]))
        return y.reshape(*lead, y.shape[-1])


def _linear(din, dout, dtype, rngs):
    return Linear(
        din, dout, kernel_init=trunc_normal(), bias_init=_zeros,
        dtype=dtype, param_dtype=jnp.float32, rngs=rngs,
    )


NORM_EPS = 1e-6  # I-JEPA / V-JEPA vit_*: partial(nn.LayerNorm, eps=1e-6)


def _layer_norm(dim, dtype, rngs, eps: float = NORM_EPS):
    """LayerNorm in float32 whatever the compute dtype: torch autocast runs layer_norm in float32."""
    del dtype
    return nnx.LayerNorm(dim, epsilon=eps, dtype=jnp.float32, param_dtype=jnp.float32, rngs=rngs)


class Attention(nnx.Module):
    """Multi-head self-attention. `impl` (set on a built model by `use_attention`): 'xla' the einsums
    and float32 softmax written out below (the official maths); 'dot_product' jax.nn.dot_product_attention,
    which takes cuDNN's fused flash attention on a GPU where it applies and the same maths elsewhere."""

    impl = "xla"

    def __init__(self, dim: int, heads: int, dtype, rngs: nnx.Rngs):
        self.heads = heads
        self.dtype = dtype
        self.qkv = _linear(dim, 3 * dim, dtype, rngs)
        self.proj = _linear(dim, dim, dtype, rngs)

    def __call__(self, x, key_valid=None):
        n, length, dim = x.shape
        hd = dim // self.heads
        qkv = self.qkv(x).reshape(n, length, 3, self.heads, hd)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        if self.impl == "dot_product":
            mask = None if key_valid is None else key_valid[:, None, None, :]
            return self.proj(jax.nn.dot_product_attention(q, k, v, mask=mask).reshape(n, length, dim))
        logits = jnp.einsum("nqhd,nkhd->nhqk", q * jnp.asarray(hd**-0.5, q.dtype), k)
        logits = logits.astype(jnp.float32)
        if key_valid is not None:
            logits = jnp.where(key_valid[:, None, None, :], logits, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
        out = jnp.einsum("nhqk,nkhd->nqhd", weights, v).reshape(n, length, dim)
        return self.proj(out)


@jax.custom_vjp
def gelu(x):
    """Exact (erf) GELU, as torch.nn.GELU in the official code: x * Phi(x).

    Same values as jax.nn.gelu(approximate=False); the custom backward reuses Phi(x) from the
    forward pass, where autodiff of erf made XLA:CPU recompute it (the MLP backward ran 2.3x slower).
    """
    return x * _normal_cdf(x)


def _normal_cdf(x):
    return 0.5 * (1.0 + jax.lax.erf(x * np.asarray(1.0 / np.sqrt(2.0), x.dtype)))


def _gelu_forward(x):
    cdf = _normal_cdf(x)
    return x * cdf, (x, cdf)


def _gelu_backward(residuals, grad):
    x, cdf = residuals
    density = jnp.exp(-0.5 * x * x) * np.asarray(1.0 / np.sqrt(2.0 * np.pi), x.dtype)  # phi(x)
    return (grad * (cdf + x * density),)


gelu.defvjp(_gelu_forward, _gelu_backward)


class Mlp(nnx.Module):
    def __init__(self, dim: int, hidden: int, dtype, rngs: nnx.Rngs):
        self.fc1 = _linear(dim, hidden, dtype, rngs)
        self.fc2 = _linear(hidden, dim, dtype, rngs)

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
                 cond_dim: int | None = None, mixer: str = "attn", ssm_state: int = 64, norm_eps: float = NORM_EPS):
        affine = cond_dim is None
        norm = functools.partial(_layer_norm, eps=norm_eps) if affine else _plain_layer_norm
        self.norm1 = norm(dim, dtype, rngs)
        if mixer == "attn":
            self.attn = Attention(dim, heads, dtype, rngs)
        else:
            from jepa_cli.models.s5 import S5Mixer

            self.ssm = S5Mixer(dim, ssm_state, dtype, rngs)
        self.norm2 = norm(dim, dtype, rngs)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), dtype, rngs)
        self.modulation = None if affine else ZeroLinear(cond_dim, 6 * dim, dtype, rngs)

    def __call__(self, x, key_valid=None, cond=None):
        mix = self.attn if hasattr(self, "attn") else self.ssm
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


def run_blocks(blocks, x, key_valid=None, cond=None, *, scan: bool = False, remat: str = "none"):
    """x [B, N, D] through ``blocks`` in order: ``for blk in blocks: x = blk(x, key_valid, cond)``.

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
                x = run_blocks(blocks[start:end], x, key_valid, cond, scan=scan, remat=remat)
                start = end
        return x
    if not scan and remat == "none":
        for blk in blocks:
            x = blk(x, key_valid, cond)
        return x
    graphdef = nnx.graphdef(blocks[0])

    def body(x, state):
        return nnx.merge(graphdef, state)(x, key_valid, cond)

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


def _plain_layer_norm(dim, dtype, rngs):
    """LayerNorm without scale and bias (eps 1e-6), as DiT's modulated norms."""
    return nnx.LayerNorm(dim, epsilon=1e-6, use_scale=False, use_bias=False, dtype=dtype,
                         param_dtype=jnp.float32, rngs=rngs)


@functools.lru_cache(maxsize=64)
def _rank(grid: tuple[int, ...], order: str) -> np.ndarray:
    return scan_rank(grid, order)


def to_scan_order(x, positions, valid, grid: tuple[int, ...], order: str):
    """Tokens x [B, L, D] sorted into the scan `order` of `grid`: (x, valid, back), where back(y)
    puts y [B, L, ...] into the original slots again. `positions` int [B, L] are the tokens' raster
    indices (None: x is the whole grid in raster order); invalid slots (valid [B, L] False) go last,
    so a recurrence reaches them only after every valid token."""
    rank = _rank(tuple(grid), order)
    if positions is None:
        perm = np.argsort(rank)  # static: the scan's raster indices
        inverse = jnp.asarray(rank)
        return (x[:, perm], None if valid is None else valid[:, perm],
                lambda y: jnp.take(y, inverse, axis=1))
    key = jnp.asarray(rank)[positions]
    if valid is not None:
        key = jnp.where(valid, key, rank.size)
    perm = jnp.argsort(key, axis=1, stable=True)  # [B, L]
    inverse = jnp.argsort(perm, axis=1)
    take = lambda y, p: jnp.take_along_axis(y, p.reshape(*p.shape, *(1,) * (y.ndim - 2)), axis=1)  # noqa: E731
    return take(x, perm), None if valid is None else take(valid, perm), lambda y: take(y, inverse)


def _blocks(width, heads, mlp_ratio, dtype, rngs, depth, mixers, ssm_state, norm_eps=NORM_EPS):
    """`depth` blocks; mixers None: all attention, the ViT's blocks in the official parameter order."""
    if mixers is None:
        return nnx.List([Block(width, heads, mlp_ratio, dtype, rngs, norm_eps=norm_eps) for _ in range(depth)])
    if len(mixers) != depth:
        raise InputError(f"{len(mixers)} mixers for {depth} blocks")
    return nnx.List([Block(width, heads, mlp_ratio, dtype, rngs, mixer=m, ssm_state=ssm_state, norm_eps=norm_eps)
                     for m in mixers])


def gather_tokens(x, index):
    """x [B, N, D], index [B, ...] -> [B, ..., D]."""
    b = x.shape[0]
    flat = index.reshape(b, -1)
    out = jnp.take_along_axis(x, flat[..., None].astype(jnp.int32), axis=1)
    return out.reshape(*index.shape, x.shape[-1])


class VisionTransformer(nnx.Module):
    """ViT encoder: images [B, H, W, C] (or clips [B, T, H, W, C] when ``num_frames`` is set: tubelets
    of ``tubelet_size`` frames) -> tokens [B, K, D * last_layers] (or [B, C, K, ...])."""

    def __init__(
        self, *, image_size: tuple[int, int], patch_size: int, channels: int, width: int,
        depth: int, heads: int, mlp_ratio: float = 4.0, dtype=jnp.float32, rngs: nnx.Rngs,
        num_frames: int | None = None, tubelet_size: int = 1, scan_layers: bool = False,
        remat: str = "none", mixers: tuple[str, ...] | None = None, ssm_state: int = 64,
        scan_order: str = "raster", norm_eps: float = NORM_EPS,
    ):
        self.scan_layers, self.remat = scan_layers, remat
        # a stack with a recurrent block runs in scan order (None: attention only, order-free)
        self.scan_order = scan_order if mixers is not None and "s5" in mixers else None
        self.image_size = tuple(image_size)
        self.patch_size = patch_size
        self.width = width
        self.dtype = dtype
        self.grid = (image_size[0] // patch_size, image_size[1] // patch_size)
        self.tubelet_size = tubelet_size if num_frames else None
        if num_frames:  # a 3D grid: (frames / tubelet, rows, columns)
            self.grid = (num_frames // tubelet_size, *self.grid)
        kernel = (tubelet_size, patch_size, patch_size) if num_frames else (patch_size, patch_size)
        self.patch_embed = nnx.Conv(
            channels, width, kernel_size=kernel, strides=kernel, padding="VALID",
            kernel_init=trunc_normal(), bias_init=_zeros,
            dtype=dtype, param_dtype=jnp.float32, rngs=rngs,
        )
        self.blocks = _blocks(width, heads, mlp_ratio, dtype, rngs, depth, mixers, ssm_state, norm_eps)
        self.norm = _layer_norm(width, dtype, rngs, norm_eps)

    def patchify(self, images):
        """The strided convolution as one matmul: [B, H, W, C] -> [B, h*w, D] (raster order), or
        clips [B, T, H, W, C] -> [B, (T/t)*h*w, D] (frame-major)."""
        if self.tubelet_size is not None:
            return self._patchify_clips(images)
        b, hh, ww, c = images.shape
        p = self.patch_size
        gh, gw = hh // p, ww // p
        x = images.astype(self.dtype).reshape(b, gh, p, gw, p, c)
        x = x.transpose(0, 1, 3, 2, 4, 5).reshape(b * gh * gw, p * p * c)  # 2-D: see Linear
        kernel = self.patch_embed.kernel[...].astype(self.dtype).reshape(p * p * c, self.width)
        x = x @ kernel + self.patch_embed.bias[...].astype(self.dtype)
        return x.reshape(b, gh * gw, self.width)

    def _patchify_clips(self, clips):
        """The 3D convolution (tubelet x patch x patch, stride = kernel) as one matmul."""
        b, tt, hh, ww, c = clips.shape
        t, p = self.tubelet_size, self.patch_size
        gt, gh, gw = tt // t, hh // p, ww // p
        x = clips.astype(self.dtype).reshape(b, gt, t, gh, p, gw, p, c)
        x = x.transpose(0, 1, 3, 5, 2, 4, 6, 7).reshape(b * gt * gh * gw, t * p * p * c)
        kernel = self.patch_embed.kernel[...].astype(self.dtype).reshape(t * p * p * c, self.width)
        x = x @ kernel + self.patch_embed.bias[...].astype(self.dtype)
        return x.reshape(b, gt * gh * gw, self.width)

    def __call__(self, images, index=None, valid=None, last_layers: int = 1):
        x = self.patchify(images)
        pos = pos_embed(self.width, self.grid)
        # the residual stream is float32 (the float32 position table promotes the bf16 patch
        # embedding, as under torch autocast); blocks add their bf16 branches to it
        x = x.astype(jnp.float32) + jnp.asarray(pos, jnp.float32)[None]
        lead = None
        if index is not None:
            x = gather_tokens(x, index)  # [B, K, D] or [B, C, K, D]
            if index.ndim == 3:
                lead = index.shape[:2]
                x = x.reshape(-1, *x.shape[2:])
                if valid is not None:
                    valid = valid.reshape(-1, valid.shape[-1])
        back = None
        if self.scan_order is not None:
            positions = None if index is None else index.reshape(-1, index.shape[-1])
            x, valid, back = to_scan_order(x, positions, valid, self.grid, self.scan_order)
        depth = len(self.blocks)
        if not 1 <= last_layers <= depth:
            raise InputError(f"last_layers must be in 1..{depth}, got {last_layers}")
        blocks = list(self.blocks)
        x = run_blocks(blocks[:depth - last_layers], x, valid, scan=self.scan_layers, remat=self.remat)
        outs = []
        for blk in blocks[depth - last_layers:]:
            x = run_blocks([blk], x, valid, remat=self.remat)
            outs.append(self.norm(x))
        x = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=-1)
        if back is not None:
            x = back(x)
        if lead is not None:
            x = x.reshape(*lead, *x.shape[1:])
        return x


class VisionTransformerPredictor(nnx.Module):
    """I-JEPA predictor: context tokens -> predictions at the target positions [B, M, T, D]."""

    def __init__(
        self, *, grid: tuple[int, ...], embed_dim: int, width: int, depth: int, heads: int,
        mlp_ratio: float = 4.0, dtype=jnp.float32, rngs: nnx.Rngs, num_mask_tokens: int | None = None,
        scan_layers: bool = False, remat: str = "none", mixers: tuple[str, ...] | None = None,
        ssm_state: int = 64, scan_order: str = "raster", norm_eps: float = NORM_EPS,
    ):
        self.scan_layers, self.remat = scan_layers, remat
        self.scan_order = scan_order if mixers is not None and "s5" in mixers else None
        self.grid = tuple(grid)  # (rows, columns), or (frames, rows, columns) for video
        self.width = width
        self.dtype = dtype
        self.predictor_embed = _linear(embed_dim, width, dtype, rngs)
        if num_mask_tokens is None:  # I-JEPA: one trunc-normal mask token
            self.mask_token = nnx.Param(trunc_normal()(rngs.params(), (1, 1, width)))
        else:  # V-JEPA: one zero-initialised token per mask type (vitl16.yaml zero_init_mask_tokens)
            self.mask_tokens = nnx.Param(jnp.zeros((num_mask_tokens, 1, width), jnp.float32))
        self.blocks = _blocks(width, heads, mlp_ratio, dtype, rngs, depth, mixers, ssm_state, norm_eps)
        self.norm = _layer_norm(width, dtype, rngs, norm_eps)
        self.proj = _linear(width, embed_dim, dtype, rngs)

    def __call__(self, context, context_index, context_valid, target_index, target_valid):
        """context [B, C, K, D] (or [B, K, D]), context_index/valid [B, C, K] (or [B, K]),
        target_index/valid [B, M, T]. C == 1: the context predicts every target set; C == M:
        context c predicts target set c. Returns [B, M, T, D] in the compute dtype (the output
        projection's); the residual stream and LayerNorms run in float32."""
        if context.ndim == 3:
            context, context_index = context[:, None], context_index[:, None]
            context_valid = None if context_valid is None else context_valid[:, None]
        b, c, k, _ = context.shape
        m, t = target_index.shape[1:]
        if c not in (1, m):
            raise InputError(f"{c} contexts cannot pair with {m} target sets (need 1 or {m})")
        if context_valid is None:
            context_valid = jnp.ones(context_index.shape, bool)
        if target_valid is None:
            target_valid = jnp.ones(target_index.shape, bool)
        pos = jnp.asarray(pos_embed(self.width, self.grid), jnp.float32)  # float32 residual stream
        x = self.predictor_embed(context) + pos[context_index]  # [B, C, K, W]
        x = jnp.broadcast_to(x, (b, m, k, self.width))
        cvalid = jnp.broadcast_to(context_valid, (b, m, k))
        if hasattr(self, "mask_tokens"):  # target set m gets mask token m (V-JEPA's mask_index)
            if self.mask_tokens.shape[0] != m:
                raise InputError(f"{m} target sets but {self.mask_tokens.shape[0]} mask tokens")
            mask = self.mask_tokens[...][None]  # [1, M, 1, W]
        else:
            mask = self.mask_token[...]
        tokens = mask + pos[target_index]  # [B, M, T, W]
        x = jnp.concatenate([x, tokens], axis=2).reshape(b * m, k + t, self.width)
        valid = jnp.concatenate([cvalid, target_valid], axis=2).reshape(b * m, k + t)
        if self.scan_order is None:
            x = run_blocks(self.blocks, x, valid, scan=self.scan_layers, remat=self.remat)
        else:  # context and mask tokens interleaved in scan order: each target sees its neighbours
            where = jnp.concatenate([jnp.broadcast_to(context_index, (b, m, k)), target_index], axis=2)
            x, svalid, back = to_scan_order(x, where.reshape(b * m, k + t), valid, self.grid, self.scan_order)
            x = back(run_blocks(self.blocks, x, svalid, scan=self.scan_layers, remat=self.remat))
        x = self.norm(x[:, k:])
        return self.proj(x).reshape(b, m, t, -1)


def param_count(tree) -> int:
    return int(sum(np.prod(np.shape(x)) for x in jax.tree.leaves(tree)))


def first_non_finite(tree) -> tuple[tuple, int, int] | None:
    """The first float leaf of a parameter tree that holds NaN or inf, as (its key path, how many such
    values, its size); None when every value is finite (a diverged run's weights are not)."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        value = np.asarray(leaf)
        if value.dtype.kind in "fc" and not np.isfinite(value).all():
            return path, int(value.size - np.count_nonzero(np.isfinite(value))), int(value.size)
    return None
