"""What a source for `jepa ingest` is: `Source` (images and clips, data/sources.py and data/video.py)
and `AudioSource` (data/audio.py, data/tones.py), each decoding one sample at a time, and
`BadSample`, the error of one sample that cannot be decoded."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np


class BadSample(Exception):
    """One sample that cannot be decoded; `--skip-bad` skips it, otherwise it is an InputError."""


@dataclass
class Source:
    """A random-access collection of samples with labels known up front."""

    description: str
    count: int
    read: Callable[[int], Any]  # index -> PIL.Image or np.ndarray [H, W] / [H, W, C]; raises BadSample
    item_name: Callable[[int], str]  # index -> name used in error messages
    labels: np.ndarray | None = None  # int32 [count]
    class_names: list[str] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)  # the files and folders it reads (an output must avoid them)
    codec: Any = None  # how ingest converts samples: None for images; video.ClipCodec for clips
    attributes: dict[str, Any] = field(default_factory=dict)  # extra dataset attributes (video: frames, fps, ...)
    # video: the shape [T, H, W, C] of the first sample at its own size, from headers only (None when
    # they cannot tell), so that ingest refuses a clip too big for memory before decoding one
    peek: Callable[[], tuple[int, ...] | None] | None = None
    groups: np.ndarray | None = None  # int32 [count], indices into group_names: what --split keeps together
    group_names: list[str] = field(default_factory=list)
    grouping: dict[str, Any] | None = None  # how the groups were found (data/labels.py Naming.provenance)


@dataclass
class AudioSource:
    """Clips with labels known up front; `read(i)` decodes one: (float32 [samples] mono at
    `sample_rate`, its original duration in seconds); BadSample when it cannot."""

    description: str
    count: int
    read: Callable[[int, int], tuple[np.ndarray, float]]  # (index, sample_rate) -> (mono wave, seconds)
    item_name: Callable[[int], str]
    labels: np.ndarray | None = None
    class_names: list[str] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)
    groups: np.ndarray | None = None  # int32 [count], indices into group_names: what --split keeps together
    group_names: list[str] = field(default_factory=list)
    grouping: dict[str, Any] | None = None  # how the groups were found (data/labels.py Naming.provenance)
