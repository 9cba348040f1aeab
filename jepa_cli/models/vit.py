"""Vision Transformer encoder and I-JEPA predictor (Flax NNX).

Follows the official I-JEPA src/models/vision_transformer.py: convolutional patchify, fixed 2D
sin-cos position embedding added before masking, no CLS token, pre-norm blocks (models/block.py:
LayerNorm eps 1e-6 unless `norm_eps` says otherwise, qkv bias, GELU MLP), final LayerNorm. Every Linear / Conv weight is trunc-normal(0.02) (PyTorch's
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

import jax.numpy as jnp
from flax import nnx

from jepa_cli.errors import InputError
from jepa_cli.models.block import make_blocks, run_blocks
from jepa_cli.models.layers import NORM_EPS, layer_norm, linear_layer, trunc_normal, zero_init
from jepa_cli.names import COMPUTE_DTYPES
from jepa_cli.models.mixer_pattern import SSM_STEP
from jepa_cli.models.pos_embed import sincos_2d, sincos_3d
from jepa_cli.models.scan_order import to_scan_order


DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}  # compute dtype names -> JAX dtypes
assert tuple(DTYPES) == COMPUTE_DTYPES


def pos_embed(dim: int, grid: tuple[int, ...]):
    """Fixed sin-cos position embedding of a 2D (rows, columns) or 3D (frames, rows, columns) grid;
    3D splits the features equally over the three axes (V-JEPA vitl16.yaml: uniform_power true)."""
    return sincos_3d(dim, tuple(grid), True) if len(grid) == 3 else sincos_2d(dim, tuple(grid))


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
        ssm_step: tuple[float, float] = SSM_STEP, scan_order: str = "raster", ssm_gaps: str = "skip",
        norm_eps: float = NORM_EPS,
    ):
        self.scan_layers, self.remat = scan_layers, remat
        # a stack with a recurrent block runs in scan order (None: attention only, order-free)
        self.scan_order = scan_order if mixers is not None and "s5" in mixers else None
        self.ssm_gaps = ssm_gaps
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
            kernel_init=trunc_normal(), bias_init=zero_init,
            dtype=dtype, param_dtype=jnp.float32, rngs=rngs,
        )
        self.blocks = make_blocks(width, heads, mlp_ratio, dtype, rngs, depth, mixers, ssm_state, ssm_step, norm_eps)
        self.norm = layer_norm(width, dtype, rngs, norm_eps)

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
        back = times = None
        if self.scan_order is not None:
            positions = None if index is None else index.reshape(-1, index.shape[-1])
            x, valid, back, times = to_scan_order(x, positions, valid, self.grid, self.scan_order)
            times = times if self.ssm_gaps == "elapse" else None
        depth = len(self.blocks)
        if not 1 <= last_layers <= depth:
            raise InputError(f"last_layers must be in 1..{depth}, got {last_layers}")
        blocks = list(self.blocks)
        x = run_blocks(blocks[:depth - last_layers], x, valid, scan=self.scan_layers, remat=self.remat, times=times)
        outs = []
        for blk in blocks[depth - last_layers:]:
            x = run_blocks([blk], x, valid, remat=self.remat, times=times)
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
        ssm_state: int = 64, ssm_step: tuple[float, float] = SSM_STEP, scan_order: str = "raster",
        ssm_gaps: str = "skip", norm_eps: float = NORM_EPS,
    ):
        self.scan_layers, self.remat = scan_layers, remat
        self.scan_order = scan_order if mixers is not None and "s5" in mixers else None
        self.ssm_gaps = ssm_gaps
        self.grid = tuple(grid)  # (rows, columns), or (frames, rows, columns) for video
        self.width = width
        self.dtype = dtype
        self.predictor_embed = linear_layer(embed_dim, width, dtype, rngs)
        if num_mask_tokens is None:  # I-JEPA: one trunc-normal mask token
            self.mask_token = nnx.Param(trunc_normal()(rngs.params(), (1, 1, width)))
        else:  # V-JEPA: one zero-initialised token per mask type (vitl16.yaml zero_init_mask_tokens)
            self.mask_tokens = nnx.Param(jnp.zeros((num_mask_tokens, 1, width), jnp.float32))
        self.blocks = make_blocks(width, heads, mlp_ratio, dtype, rngs, depth, mixers, ssm_state, ssm_step, norm_eps)
        self.norm = layer_norm(width, dtype, rngs, norm_eps)
        self.proj = linear_layer(width, embed_dim, dtype, rngs)

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
            x, svalid, back, times = to_scan_order(x, where.reshape(b * m, k + t), valid, self.grid, self.scan_order)
            times = times if self.ssm_gaps == "elapse" else None
            x = back(run_blocks(self.blocks, x, svalid, scan=self.scan_layers, remat=self.remat, times=times))
        x = self.norm(x[:, k:])
        return self.proj(x).reshape(b, m, t, -1)
