"""Fixed sin-cos position embeddings (the semantics of the official I-JEPA / V-JEPA helpers).

All functions return float32 NumPy arrays of shape [num_tokens, dim], tokens in raster order
(frame-major for 3D). They are cached, so calling them inside a traced function is cheap and the
result becomes a compile-time constant.
"""

from __future__ import annotations

import functools

import numpy as np


def sincos_1d_from_grid(dim: int, pos: np.ndarray) -> np.ndarray:
    """[N, dim]: sin of pos * omega in the first half, cos in the second, omega = 1/10000^(2i/dim)."""
    if dim % 2:
        raise ValueError(f"sin-cos embedding dimension must be even, got {dim}")
    omega = np.arange(dim // 2, dtype=np.float64)
    omega /= dim / 2.0
    omega = 1.0 / 10000**omega
    out = np.einsum("m,d->md", np.asarray(pos, dtype=np.float64).reshape(-1), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


@functools.lru_cache(maxsize=64)
def sincos_2d(dim: int, grid: tuple[int, int] | int) -> np.ndarray:
    """[h*w, dim] for a grid of h rows and w columns (raster order).

    As the official get_2d_sincos_pos_embed: the first half of the features encodes the column
    (w) coordinate, the second half the row (h) coordinate (np.meshgrid(grid_w, grid_h)).
    """
    h, w = (grid, grid) if isinstance(grid, int) else grid
    if dim % 2:
        raise ValueError(f"2D sin-cos embedding dimension must be even, got {dim}")
    gw, gh = np.meshgrid(np.arange(w, dtype=np.float64), np.arange(h, dtype=np.float64))
    emb = np.concatenate(
        [sincos_1d_from_grid(dim // 2, gw), sincos_1d_from_grid(dim // 2, gh)], axis=1
    )
    emb = emb.astype(np.float32)
    emb.setflags(write=False)
    return emb


@functools.lru_cache(maxsize=64)
def sincos_3d(
    dim: int, grid: tuple[int, int, int], uniform_power: bool = True
) -> np.ndarray:
    """[d*h*w, dim] for a (frames, rows, columns) grid, frame-major raster order.

    As the official V-JEPA get_3d_sincos_pos_embed: features are [depth | row | column];
    uniform_power gives each axis ceil(dim/6)*2 features (then cut to dim), otherwise
    dim/2 for depth and dim/4 for each spatial axis.
    """
    d, h, w = grid
    if uniform_power:
        dd = hd = wd = int(np.ceil(dim / 6) * 2)
    else:
        hd = wd = dim // 4
        dd = dim // 2
    gh, gd, gw = np.meshgrid(
        np.arange(h, dtype=np.float64),
        np.arange(d, dtype=np.float64),
        np.arange(w, dtype=np.float64),
    )
    emb = np.concatenate(
        [sincos_1d_from_grid(dd, gd), sincos_1d_from_grid(hd, gh), sincos_1d_from_grid(wd, gw)],
        axis=1,
    )[:, :dim]
    emb = emb.astype(np.float32)
    emb.setflags(write=False)
    return emb
