"""Reading the frames of one video for `jepa ingest`: a folder of frame images (Pillow) or a video
file (PyAV), each a reader of the frames a clip needs; failures are a BadSample naming the video."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from jepa_cli.data.clips import ClipOptions, clip_indices, images_in
from jepa_cli.data.samples import BadSample
from jepa_cli.data.store import utf8_text


def frame_folder(folder: Path, name: str) -> tuple[Callable, int, None]:
    """A folder of frame images in natural name order (frame2 before frame10)."""
    files = images_in(folder)

    def frames_of(idx: np.ndarray) -> list:
        from PIL import Image

        sizes = {}
        for f in files:  # headers only: every frame of the folder, not just the clip's
            try:
                with Image.open(f) as image:
                    sizes.setdefault(image.size, f.name)
            except Exception:  # noqa: BLE001 - reported with its reason when the clip decodes it
                continue
            if len(sizes) > 1:
                (a, fa), (b, fb) = sizes.items()
                raise BadSample(utf8_text(f"{name}: frame {fb} is {b[1]}x{b[0]} but {fa} is {a[1]}x{a[0]} "
                                          "(every frame of a clip folder must have one size)"))
        out, first, decoded = [], None, {}
        for j in idx:
            if j in decoded:  # a short clip repeats its last frame: decoded once
                out.append(decoded[j])
                continue
            try:
                image = Image.open(files[j])
                image.load()
            except Exception as exc:  # noqa: BLE001 - Pillow raises many kinds for a corrupt file
                raise BadSample(utf8_text(f"{files[j]}: cannot decode image ({type(exc).__name__}: {exc})")) from None
            decoded[j] = image
            if first is None:
                first = (files[j].name, image.size)
            elif image.size != first[1]:
                raise BadSample(utf8_text(f"{name}: frame {files[j].name} is {image.size[1]}x{image.size[0]} but "
                                          f"{first[0]} is {first[1][1]}x{first[1][0]} (every frame of a clip "
                                          "folder must have one size)"))
            out.append(image)
        return out

    return frames_of, len(files), None


def decode_file(path: Path, name: str, options: ClipOptions) -> tuple[Callable, int, float | None]:
    """A video file's frame count and rate, and a reader of the frames its clips need: one decoding
    pass keeps only those frames (RGB), so memory holds K x F frames, never the whole video. The count
    is the container's, or one counting pass when it has none; frames the file turns out not to have
    repeat the last one decoded. FFmpeg decodes with its own threads over the cores."""
    import av

    def fail(exc: Exception) -> BadSample:
        reason = " ".join(str(exc).split())[:160]
        return BadSample(utf8_text(f"{name}: cannot decode video ({type(exc).__name__}: {reason})"))

    def open_stream(container):
        if not container.streams.video:
            raise BadSample(f"{name}: holds no video stream")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        return stream

    try:
        with av.open(str(path)) as container:
            stream = open_stream(container)
            rate = float(stream.average_rate) if stream.average_rate else None
            length = int(stream.frames or 0) or sum(1 for _ in container.decode(stream))
    except BadSample:
        raise
    except Exception as exc:  # noqa: BLE001 - PyAV raises many kinds (InvalidDataError, EOFError, ...)
        raise fail(exc) from None
    kept: dict[int, np.ndarray] = {}

    def frames_of(idx: np.ndarray) -> list:
        if not kept:
            wanted = {int(j) for clip in clip_indices(length, options) for j in clip}
            last, size = None, None
            try:
                with av.open(str(path)) as container:
                    for j, frame in enumerate(container.decode(open_stream(container))):
                        if j in wanted:
                            kept[j] = frame.to_ndarray(format="rgb24")
                            size = size or kept[j].shape
                            if kept[j].shape != size:
                                raise BadSample(f"{name}: frame sizes change inside the video")
                        last = j
                        if j >= max(wanted):
                            break
            except BadSample:
                raise
            except Exception as exc:  # noqa: BLE001
                raise fail(exc) from None
            if last is None:
                raise BadSample(f"{name}: has no frames")
            for j in sorted(wanted):  # past the decoded end: the last kept frame
                if j not in kept:
                    kept[j] = kept[max(k for k in kept if k < j)]
        return [kept[int(j)] for j in idx]

    return frames_of, length, rate
