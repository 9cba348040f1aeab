"""How clips are cut from a video: `ClipOptions` (frames, stride, clips per video), the frame indices
of each clip, and the frame images of a folder in their natural order (docs/formats.md, "Video")."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jepa_cli.data import folders
from jepa_cli.data.folders import IMAGE_EXTENSIONS
from jepa_cli.errors import InputError

DEFAULT_FRAMES, DEFAULT_STRIDE = 16, 4  # V-JEPA configs/pretrain/vitl16.yaml: num_frames 16, sampling_rate 4
MAX_CLIP_FRAMES = 1 << 16  # 36 minutes at 30 fps in one clip


@dataclass(frozen=True)
class ClipOptions:
    """How clips are cut from a video (None: the source's default) and what a too-short video does:
    padded by repeating its last frame, or skipped (`skip_short`, from --skip-bad)."""

    frames: int | None = None
    frame_stride: int | None = None
    clips_per_video: int | None = None
    skip_short: bool = False

    def __post_init__(self):
        for name in ("frames", "frame_stride", "clips_per_video"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.frames is not None and self.frames > MAX_CLIP_FRAMES:
            raise InputError(f"--frames {self.frames}: the limit is {MAX_CLIP_FRAMES} frames per clip (each frame of "
                             "a clip is converted and resized on its own: more would run for hours)")

    @property
    def explicit(self) -> bool:
        """Whether the user set any clip option (they apply to video sources only)."""
        return any(v is not None for v in (self.frames, self.frame_stride, self.clips_per_video))

    def resolved(self, decoded: bool) -> "ClipOptions":
        """Video files and frame folders: V-JEPA's 16 frames every 4 unless set; arrays keep each row's
        frames (stride 1) unless set; one clip per video."""
        frames = self.frames if self.frames is not None or not decoded else DEFAULT_FRAMES
        stride = self.frame_stride or (DEFAULT_STRIDE if decoded else 1)
        return ClipOptions(frames, stride, self.clips_per_video or 1, self.skip_short)


def clip_indices(length: int, options: ClipOptions) -> list[np.ndarray]:
    """Frame indices of each clip of a video of `length` frames (K evenly spaced starts; indices past
    the end repeat the last frame)."""
    frames = options.frames or length
    last_start = max(length - span(options, length), 0)
    starts = np.round(np.linspace(0, last_start, options.clips_per_video)).astype(int)
    stride = min(options.frame_stride, max(length, 1))  # a longer stride reaches past the end just the same
    return [np.minimum(s + np.arange(frames) * stride, length - 1) for s in starts]


def span(options: ClipOptions, length: int) -> int:
    """Frames one clip covers: (frames - 1) x stride + 1."""
    frames = options.frames or length
    return (frames - 1) * options.frame_stride + 1


def _natural(path: Path):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def images_in(folder: Path) -> list[Path]:
    return sorted(folders.files_in(folder, IMAGE_EXTENSIONS), key=_natural)
