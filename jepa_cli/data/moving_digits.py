"""`builtin:moving-digits`: one clip per built-in digit moving and bouncing in its frame, generated on
the fly with fixed seeds (docs/formats.md, "Video clips")."""

from __future__ import annotations

from typing import Any

import numpy as np

from jepa_cli.data.clips import ClipOptions
from jepa_cli.data.digits import load_digit_images
from jepa_cli.data.video import clip_attributes, video_source
from jepa_cli.errors import InputError

DIRECTIONS = ["up-left", "up-right", "down-left", "down-right"]
MOVING_FRAMES = 16


def moving_digits(query: str) -> Any:
    """builtin:moving-digits[?label=digit|direction&digits=1|2&size=32|64]: one clip per built-in
    digit, generated on the fly with fixed seeds (the same clips on every machine)."""
    options = {"label": "digit", "digits": "1", "size": "32"}
    for part in filter(None, query.split("&")):
        key, _, value = part.partition("=")
        if key not in options:
            raise InputError(f"builtin:moving-digits: unknown option {key!r} (label, digits, size)")
        options[key] = value
    allowed = {"label": ("digit", "direction"), "digits": ("1", "2"), "size": ("32", "64")}
    for key, value in options.items():
        if value not in allowed[key]:
            raise InputError(f"builtin:moving-digits: {key} must be {' or '.join(allowed[key])}, got {value!r}")
    glyphs, digit_labels, digit_names = load_digit_images()
    n, size, count = len(glyphs), int(options["size"]), int(options["digits"])
    scale = size // 16  # 8x8 glyphs drawn at half the frame's size: 16x16 in 32x32
    glyph, room = 8 * scale, size - 8 * scale
    rng = np.random.default_rng(20240601)  # fixed: every machine makes the same clips
    speed = rng.integers(1, 3, (n, count)) * (scale // 2)  # 1 or 2 pixels a frame at 32x32
    fastest = 2 * (scale // 2)  # starts this far from the walls: the first step never bounces
    start = rng.integers(fastest, room - fastest + 1, (n, count, 2))
    direction = rng.integers(0, 4, (n, count))  # 2 * (moves down) + (moves right), until a bounce
    partner = (np.arange(n) + rng.integers(1, n, n)) % n
    sign = np.stack([np.where(direction >= 2, 1, -1), np.where(direction % 2 == 1, 1, -1)], -1)  # (dy, dx)
    velocity = sign * speed[..., None]
    big = np.kron(glyphs, np.ones((scale, scale), np.uint8))  # [n, glyph, glyph]

    def read(i: int) -> np.ndarray:
        clip = np.zeros((MOVING_FRAMES, size, size, 1), np.uint8)
        for d in range(count):
            g = big[i if d == 0 else partner[i]]
            for t in range(MOVING_FRAMES):
                y, x = (int(bounce(start[i, d, a] + velocity[i, d, a] * t, room)) for a in range(2))
                view = clip[t, y:y + glyph, x:x + glyph, 0]
                np.maximum(view, g, out=view)
        return clip

    spec = "builtin:moving-digits" + (f"?{query}" if query else "")
    if options["label"] == "digit":
        labels, names = digit_labels, digit_names
    else:
        labels, names = direction[:, 0].astype(np.int32), list(DIRECTIONS)
    attributes = clip_attributes(ClipOptions(MOVING_FRAMES, 1, 1), MOVING_FRAMES, None)
    return video_source(spec, n, read, lambda i: f"{spec}[{i}]", labels, names, [], attributes,
                        lambda: (MOVING_FRAMES, size, size, 1))


def bounce(p: np.ndarray | float, room: int) -> np.ndarray:
    """Positions p (a number or an array) reflected into [0, room]: a bounce off each wall."""
    if room == 0:
        return np.zeros_like(p)
    m = np.mod(p, 2 * room)
    return np.where(m <= room, m, 2 * room - m)
