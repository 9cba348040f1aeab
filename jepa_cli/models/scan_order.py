"""Orders in which a recurrent mixer (models/s5.py) visits a token grid (option `scan_order`).

Tokens are stored in raster order (row-major; frame-major for video, time-major for audio, whose
spectrogram rows are frames). A scan order is a permutation of those raster indices; its rank table
(`scan_rank`) gives each raster index its place in the scan. 2D orders apply to the (rows, columns)
plane; a 3D grid (frames, rows, columns) is scanned frame after frame, each frame in the 2D order.
Positions are unaffected: tokens keep their sin-cos embedding of the grid cell they came from.
`to_scan_order` sorts a batch of tokens into a scan order and gives the way back.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from jepa_cli.errors import InputError
from jepa_cli.models.mixer_pattern import SCAN_ORDERS


def _hilbert_d2xy(order: int, d: int) -> tuple[int, int]:
    """Cell (x, y) of step d on the Hilbert curve over a 2^order x 2^order square (the classic
    iterative conversion, Hilbert 1891 / Butz 1971)."""
    x = y = 0
    s, t = 1, d
    while s < (1 << order):
        rx = 1 & (t // 2)
        ry = 1 & (t ^ rx)
        if ry == 0:
            if rx == 1:
                x, y = s - 1 - x, s - 1 - y
            x, y = y, x
        x, y = x + s * rx, y + s * ry
        t //= 4
        s *= 2
    return x, y


def scan_permutation(grid: tuple[int, ...], order: str = "raster") -> np.ndarray:
    """Raster indices in scan order, int32 [prod(grid)].

    raster: row by row, left to right. serpentine: row by row, odd rows right to left (each step
    moves to a grid neighbour). hilbert: the Hilbert curve over the smallest power-of-two square that
    covers the grid, keeping the cells inside it (on a non-square or non-power-of-two grid the
    curve leaves and re-enters the grid, so a few steps jump)."""
    if order not in SCAN_ORDERS:
        raise InputError(f"unknown scan order {order!r} (choose from {', '.join(SCAN_ORDERS)})")
    *frames, h, w = grid
    cells = np.arange(h * w).reshape(h, w)
    if order == "raster":
        plane = cells.reshape(-1)
    elif order == "serpentine":
        plane = np.concatenate([row if r % 2 == 0 else row[::-1] for r, row in enumerate(cells)])
    else:
        side = 1 << max(0, int(np.ceil(np.log2(max(h, w)))))
        bits = side.bit_length() - 1
        steps = (_hilbert_d2xy(bits, d) for d in range(side * side))
        plane = np.array([cells[y, x] for x, y in steps if y < h and x < w])
    t = int(np.prod(frames)) if frames else 1
    return (np.arange(t)[:, None] * (h * w) + plane[None]).reshape(-1).astype(np.int32)


def scan_rank(grid: tuple[int, ...], order: str = "raster") -> np.ndarray:
    """The place of each raster index in the scan, int32 [prod(grid)] (the inverse permutation)."""
    perm = scan_permutation(grid, order)
    rank = np.empty_like(perm)
    rank[perm] = np.arange(perm.size, dtype=np.int32)
    return rank


@functools.lru_cache(maxsize=64)
def _rank(grid: tuple[int, ...], order: str) -> np.ndarray:
    return scan_rank(grid, order)


def to_scan_order(x, positions, valid, grid: tuple[int, ...], order: str):
    """Tokens x [B, L, D] sorted into the scan `order` of `grid`: (x, valid, back, times), where
    back(y) puts y [B, L, ...] into the original slots again and times int32 [B, L] is each sorted
    token's place in the scan of the whole grid (invalid slots: the grid's size). `positions` int
    [B, L] are the tokens' raster indices (None: x is the whole grid in raster order, and times is
    None: every token is one place after the last); invalid slots (valid [B, L] False) go last, so a
    recurrence reaches them only after every valid token."""
    rank = _rank(tuple(grid), order)
    if positions is None:
        perm = np.argsort(rank)  # static: the scan's raster indices
        inverse = jnp.asarray(rank)
        return (x[:, perm], None if valid is None else valid[:, perm],
                lambda y: jnp.take(y, inverse, axis=1), None)
    key = jnp.asarray(rank)[positions]
    if valid is not None:
        key = jnp.where(valid, key, rank.size)
    perm = jnp.argsort(key, axis=1, stable=True)  # [B, L]
    inverse = jnp.argsort(perm, axis=1)
    take = lambda y, p: jnp.take_along_axis(y, p.reshape(*p.shape, *(1,) * (y.ndim - 2)), axis=1)  # noqa: E731
    return (take(x, perm), None if valid is None else take(valid, perm), lambda y: take(y, inverse),
            take(key, perm))
