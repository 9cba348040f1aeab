"""Class-conditional DiT (Peebles & Xie 2023) over a token sequence, built from block.Block.

The model sees tokens [B, L, in_dim] (image patches flattened, or pieces of a latent vector, or
latent tokens: the objective makes them) and returns [B, L, out_dim]. Conditioning: a sinusoidal
embedding of the noise level through a 2-layer SiLU MLP, plus a label embedding with one extra
null class (index num_classes) for classifier-free guidance; blocks are adaLN-Zero modulated
(block.Block with cond_dim) and the final layer is modulated (shift, scale) with a zero-initialised
projection, so the untrained model outputs 0. `mixers` (one per block, 'attn' or 's5') puts S5
mixers (models/s5.py) in some blocks, modulated the same way; the blocks see a 2D grid's tokens in
`scan_order` (models/scan_order.py) and a 1D sequence's in its own order.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jepa_cli.models.mixer_pattern import SSM_STEP
from jepa_cli.models.pos_embed import sincos_1d_from_grid, sincos_2d
from jepa_cli.models.block import Block, ZeroLinear, modulate, plain_layer_norm
from jepa_cli.models.layers import linear_layer, trunc_normal
from jepa_cli.models.scan_order import to_scan_order

FREQ_DIM = 256  # DiT's TimestepEmbedder frequency_embedding_size


def timestep_embedding(t, dim: int = FREQ_DIM, max_period: float = 10000.0):
    """DiT / ADM sinusoidal embedding of a scalar per example: [B] -> [B, dim] (cos half, sin half)."""
    half = dim // 2
    freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
    args = jnp.asarray(t, jnp.float32)[:, None] * freqs[None]
    return jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)


def positions(width: int, grid: tuple[int, ...]) -> np.ndarray:
    """Fixed sin-cos positions: 2D for an (h, w) grid of patches, 1D for (L,) tokens."""
    if len(grid) == 2:
        return sincos_2d(width, tuple(grid))
    return sincos_1d_from_grid(width, np.arange(grid[0], dtype=np.float64)).astype(np.float32)


class DiT(nnx.Module):
    def __init__(self, *, in_dim: int, out_dim: int, grid: tuple[int, ...], width: int, depth: int,
                 heads: int, num_classes: int, mlp_ratio: float = 4.0, dtype=jnp.float32, rngs: nnx.Rngs,
                 mixers: tuple[str, ...] | None = None, ssm_state: int = 64, ssm_step: tuple[float, float] = SSM_STEP,
                 scan_order: str = "raster"):
        self.grid = tuple(grid)
        # a recurrent stack on a 2D grid runs in scan order (None: attention only, or a 1D sequence)
        self.scan_order = scan_order if mixers is not None and "s5" in mixers and len(self.grid) == 2 else None
        self.width = width
        self.dtype = dtype
        self.num_classes = num_classes
        self.embed = linear_layer(in_dim, width, dtype, rngs)
        self.t_fc1 = linear_layer(FREQ_DIM, width, dtype, rngs)
        self.t_fc2 = linear_layer(width, width, dtype, rngs)
        # num_classes + 1 rows: the last is the null class of classifier-free guidance
        self.label_embed = nnx.Embed(num_classes + 1, width, embedding_init=trunc_normal(),
                                     param_dtype=jnp.float32, rngs=rngs)
        if mixers is None:
            self.blocks = nnx.List([Block(width, heads, mlp_ratio, dtype, rngs, cond_dim=width)
                                    for _ in range(depth)])
        else:
            self.blocks = nnx.List([Block(width, heads, mlp_ratio, dtype, rngs, cond_dim=width, mixer=m,
                                          ssm_state=ssm_state, ssm_step=ssm_step) for m in mixers[:depth]])
        self.final_norm = plain_layer_norm(width, dtype, rngs)
        self.final_modulation = ZeroLinear(width, 2 * width, dtype, rngs)
        self.final_proj = ZeroLinear(width, out_dim, dtype, rngs)

    def __call__(self, tokens, noise_level, labels):
        """tokens [B, L, in_dim], noise_level [B] (what the time embedding sees), labels int [B]
        (num_classes = the null class) -> [B, L, out_dim] float32."""
        x = self.embed(tokens.astype(self.dtype))
        x = x + jnp.asarray(positions(self.width, self.grid), self.dtype)[None]
        t = self.t_fc2(jax.nn.silu(self.t_fc1(timestep_embedding(noise_level).astype(self.dtype))))
        c = t + self.label_embed(labels).astype(self.dtype)
        back = None
        if self.scan_order is not None:
            x, _, back, _ = to_scan_order(x, None, None, self.grid, self.scan_order)
        for blk in self.blocks:
            x = blk(x, None, c)
        if back is not None:
            x = back(x)
        shift, scale = jnp.split(self.final_modulation(jax.nn.silu(c)), 2, axis=-1)
        x = modulate(self.final_norm(x), shift, scale)
        return self.final_proj(x).astype(jnp.float32)
