"""Pictures of masks: per-cell labels of a sample and a PNG grid, over real samples when given.

Labels per patch: -2 context, -3 context overlapping a target, -1 unused, m >= 0 target block m
(3D: the pair's target).
"""

from __future__ import annotations

import numpy as np

from jepa_cli.data import atomic

TARGET_RGB = [(230, 57, 70), (69, 123, 233), (200, 80, 200), (240, 200, 40), (40, 200, 220), (255, 120, 120),
              (120, 160, 255), (255, 130, 255), (255, 135, 0), (135, 0, 175), (215, 0, 135), (255, 215, 0)]
CONTEXT_RGB, UNUSED_RGB, BOTH_RGB = (46, 160, 67), (40, 40, 40), (255, 255, 255)


def cell_labels(config, context, targets, i: int):
    """Per-sample cell labels over the flat grid, per display row: list of (title, labels [N])."""
    rows = []
    if context.ndim == 3:  # multiblock3d: one row per pair
        for p in range(context.shape[1]):
            lab = np.full(context.shape[-1], -1)
            lab[targets[i, p]] = p
            lab[context[i, p]] = -2
            rows.append((f"pair {p + 1}", lab))
    else:
        lab = np.full(context.shape[-1], -1)
        for m in range(targets.shape[1]):
            lab[targets[i, m] & (lab == -1)] = m
        both = context[i] & (lab >= 0)
        lab[context[i]] = -2
        lab[both] = -3
        rows.append(("", lab))
    return rows


def _rgb(label: int) -> tuple[int, int, int]:
    if label == -2:
        return CONTEXT_RGB
    if label == -3:
        return BOTH_RGB
    if label == -1:
        return UNUSED_RGB
    return TARGET_RGB[label % len(TARGET_RGB)]


def write_png(path, config, context, targets, samples: int, images=None, cell: int = 16, force: bool = False) -> None:
    """A picture grid: one tile per sample (3D: one row of frames per pair), over real samples if given.

    Written atomically; `force` replaces an existing PNG only (atomic.write_file)."""
    import io

    from PIL import Image

    H, W = config.grid
    D = config.frames or 1
    n = min(samples, context.shape[0])
    tiles = []
    for i in range(n):
        rows = []
        for _title, lab in cell_labels(config, context, targets, i):
            lab = lab.reshape(D, H, W)
            frames = []
            for f in range(D):
                colour = np.array([[_rgb(int(v)) for v in row] for row in lab[f]], np.uint8)  # [H, W, 3]
                tile = np.kron(colour, np.ones((cell, cell, 1), np.uint8))
                if images is not None and i < len(images):
                    img = images[i]
                    if img.ndim == 4:  # video [T, H, W, C]: the frame under this tubelet
                        img = img[min(len(img) - 1, f * len(img) // D)]
                    photo = np.asarray(Image.fromarray(img).resize((W * cell, H * cell), Image.BILINEAR), float)
                    unused = (lab[f] == -1)
                    alpha = np.where(np.kron(unused, np.ones((cell, cell))) > 0, 0.75, 0.45)[..., None]
                    tile = (photo * (1 - alpha) + tile * alpha).astype(np.uint8)
                tile[::cell, :] = 0  # patch grid lines
                tile[:, ::cell] = 0
                frames.append(tile)
                frames.append(np.full((H * cell, 4, 3), 255, np.uint8))
            rows.append(np.concatenate(frames[:-1], axis=1))
            rows.append(np.full((4, rows[-1].shape[1], 3), 255, np.uint8))
        tiles.append(np.concatenate(rows[:-1], axis=0))
    axis = 0 if config.frames else 1  # 3D samples stack vertically (each is a wide row of frames)
    gap = np.full((12, tiles[0].shape[1], 3) if axis == 0 else (tiles[0].shape[0], 12, 3), 255, np.uint8)
    picture = np.concatenate([x for t in tiles for x in (t, gap)][:-1], axis=axis)
    buffer = io.BytesIO()
    Image.fromarray(picture).save(buffer, format="PNG")
    atomic.write_file(path, buffer.getvalue(), force, atomic.PNG_MAGIC, "PNG picture")
