"""Video sources for `jepa ingest`: clip arrays, folders of frame images, video files (PyAV; their frames
are read by video_decode.py), and `builtin:moving-digits` (moving_digits.py). Every one yields clips
uint8 [T, H, W, C] (docs/formats.md, "Video"), cut as clips.py's `ClipOptions` say.

A video (a file, a folder of frames, or one row of a [N, T, H, W, C] array) gives `clips_per_video`
clips of `frames` frames taken every `frame_stride` frames, their starts evenly spaced over the
video. A video shorter than one clip's span, (frames - 1) x stride + 1, is padded by repeating its
last frame (listed in the dataset's `padded` attribute), or skipped with --skip-bad.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jepa_cli.data import folders, resources, video_decode
from jepa_cli.data.clips import ClipOptions, clip_indices, images_in, span
from jepa_cli.data.folders import VIDEO_EXTENSIONS
from jepa_cli.data.ingest import SAMPLES_IN_MEMORY
from jepa_cli.data.labels import class_ids, name_items
from jepa_cli.data.pixels import GRAY_MODES, fit, to_pixels, to_uint8
from jepa_cli.data.samples import BadSample, Source
from jepa_cli.data.store import utf8_text
from jepa_cli.errors import InputError

MISSING_PYAV = "decoding video files needs PyAV: pip install 'jepa-cli[video]'"
INDEX_BYTES = 24  # per clip: its int32 label, its int64 row index and temporaries while they are computed


# -- how ingest converts and resizes clips (data/ingest.py dispatches on Source.codec) -------------
class ClipCodec:
    """How ingest converts a video source's samples: clips uint8 [T, H, W, C], every frame resized."""

    modality = "video"
    layout = "NTHWC"

    @staticmethod
    def pixels(sample: Any, channels: int | None, name: str) -> np.ndarray:
        """A clip (array [T, H, W(, C)] or list of frames, PIL or arrays) as uint8 [T, H, W, C]."""
        frames = [to_pixels(f, channels, name) for f in sample]
        if not frames:
            raise BadSample(f"{name}: the clip has no frames")
        if channels is None and len({f.shape[-1] for f in frames}) > 1:  # gray and colour frames mixed
            frames = [to_pixels(f, 3, name) for f in frames]
        first = frames[0].shape
        for i, f in enumerate(frames):
            if f.shape != first:
                raise BadSample(f"{name}: frame {i} is {f.shape[0]}x{f.shape[1]} but frame 0 is "
                                f"{first[0]}x{first[1]} (every frame of a clip must have one size)")
        return np.stack(frames)

    @staticmethod
    def fit(clip: np.ndarray, size: tuple[int, int] | None) -> np.ndarray:
        if size is None or clip.shape[1:3] == tuple(size):
            return clip
        return np.stack([fit(f, size) for f in clip])

    @staticmethod
    def shape(native: tuple[int, ...], size: tuple[int, int] | None) -> tuple[int, ...]:
        """The stored shape [T, H, W, C] of a clip whose own shape is `native`."""
        return (native[0], *(size or native[1:3]), native[3])

    @staticmethod
    def smaller(size: tuple[int, int] | None) -> str:
        """The options that shrink a clip, for a refusal's hint."""
        return "fewer --frames or " + (f"a --size smaller than {size[0]}x{size[1]}" if size else "a smaller --size")


def clip_attributes(options: ClipOptions, frames: int, fps: float | None) -> dict[str, Any]:
    return {"frames": int(frames), "frame_stride": int(options.frame_stride), "fps": fps,
            "clips_per_video": int(options.clips_per_video), "padded": []}


def video_source(description, count, read, item_name, labels=None, class_names=(), paths=(), attributes=None,
                 peek=None) -> Any:
    """A samples.Source of clips (ClipCodec)."""
    return Source(description, count, read, item_name, labels, list(class_names), list(paths),
                  codec=ClipCodec, attributes=attributes or {}, peek=peek)


def _per_clip_labels(labels: np.ndarray, k: int, where: str) -> np.ndarray:
    """`labels` (one per video) repeated for each of the video's `k` clips; InputError naming `where`
    when the clips' labels and indices alone need more memory than is available."""
    clips = len(labels) * k
    resources.check_memory(where, clips * (4 + INDEX_BYTES), f"{len(labels)} video(s) x --clips-per-video {k} = "
                       f"{clips} clips; pass a smaller --clips-per-video")
    return np.repeat(labels, k)


# -- arrays [N, T, H, W, C] --------------------------------------------------------------------
def array_source(path: Path, array: np.ndarray, description: str, options: ClipOptions | None) -> Any:
    """Each row of a [N, T, H, W, C] array is a video; K clips per row (the whole row by default)."""
    if array.shape[-1] not in (1, 3, 4):
        raise InputError(f"{path}: expected clips [N, T, H, W, C] with C in 1, 3, 4; got shape {list(array.shape)}")
    if array.shape[1] == 0:
        raise InputError(f"{path}: the clips have zero frames (shape {list(array.shape)})")
    if not (array.dtype == np.bool_ or np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)):
        raise InputError(f"{path}: pixels must be numbers (bool, integer or float), got dtype {array.dtype}")
    options = (options or ClipOptions()).resolved(decoded=False)
    length, k = int(array.shape[1]), options.clips_per_video
    attributes = clip_attributes(options, options.frames or length, None)

    def read(i: int) -> np.ndarray:
        row, clip = divmod(i, k)
        name = _clip_name(f"{path}[{row}]", clip, k)
        _check_length(name, length, options, attributes)
        return to_uint8(np.asarray(array[row][clip_indices(length, options)[clip]]), name)

    def peek() -> tuple[int, ...]:
        return (options.frames or length, *array.shape[2:4], 1 if array.shape[-1] == 1 else 3)

    return video_source(description, int(array.shape[0]) * k, read,
                   lambda i: _clip_name(f"{path}[{i // k}]", i % k, k), attributes=attributes, peek=peek)


def per_clip(labels: np.ndarray, source: Any) -> np.ndarray:
    """Labels given per video (an array's labels, --labels), repeated for each of its K clips."""
    k = int(source.attributes.get("clips_per_video") or 1)
    return _per_clip_labels(labels, k, source.description) if k > 1 and len(labels) * k == source.count else labels


def _clip_name(video: str, clip: int, k: int) -> str:
    return video if k == 1 else f"{video}#clip{clip}"


def _check_length(name: str, length: int, options: ClipOptions, attributes: dict) -> None:
    """A video of no frames is a BadSample; one shorter than a clip's span is too with --skip-bad,
    else its clips are padded (by clip_indices) and it is listed in the `padded` attribute."""
    if length == 0:
        raise BadSample(f"{name}: has no frames")
    need = span(options, length)
    if length >= need:
        return
    if options.skip_short:
        raise BadSample(f"{name}: {length} frame(s), shorter than one clip of {options.frames} frames every "
                        f"{options.frame_stride} ({need} frames)")
    if name not in attributes["padded"]:
        attributes["padded"].append(name)


# -- folders: video files and folders of frames ------------------------------------------------
def _videos_in(folder: Path) -> list[Path]:
    return folders.files_in(folder, VIDEO_EXTENSIONS)


def _subdirs(folder: Path) -> list[Path]:
    return folders.subfolders(folder)


def is_video_file(path: Path) -> bool:
    return path.suffix.lower() in VIDEO_EXTENSIONS


def is_video_folder(root: Path, explicit: bool) -> bool:
    """A folder holds video when it (or its class folders) holds video files, when its class folders
    hold folders of frames (ROOT/<class>/<clip>/*.png), or when clip options were given."""
    if explicit or _videos_in(root):
        return True
    for sub in _subdirs(root):
        if _videos_in(sub) or any(images_in(clip) for clip in _subdirs(sub)):
            return True
    return False


def folder_source(root: Path, options: ClipOptions | None, naming: Any = None) -> Any:
    """ROOT/<class>/<video file or frame folder> (labelled) or ROOT/<video file or frame folder>,
    relabelled or grouped per video as `naming` (data/labels.py Naming) says."""
    options = (options or ClipOptions()).resolved(decoded=True)
    subdirs = _subdirs(root)
    own = _videos_in(root)
    labelled = not own and any(_videos_in(s) or _subdirs(s) for s in subdirs)
    videos: list[Path] = []
    labels: list[int] = []
    class_names: list[str] = []
    if labelled:
        for s in subdirs:
            _refuse_loose_images(s)
            found = _videos_in(s) + _subdirs(s)
            if found:
                labels += [len(class_names)] * len(found)
                class_names.append(s.name)
                videos += found
    else:
        _refuse_loose_images(root)
        videos = own + subdirs
    if not videos:
        raise InputError(utf8_text(f"{root}: no video files ({', '.join(sorted(VIDEO_EXTENSIONS))}) or folders of "
                                   "frame images found"))
    if any(v.is_file() for v in videos):
        require_pyav()
    label_array = np.asarray(labels, np.int32) if labelled else None
    class_names = utf8_text(class_names)
    groups, group_names = None, []
    if naming is not None and (naming.relabels or naming.grouped):
        named = name_items(root, videos, naming, "videos", None)
        if naming.relabels:
            label_array, class_names = class_ids(named.labels)
        groups, group_names = class_ids(named.groups)
    paths = [root] + ([Path(naming.labels_csv)] if naming is not None and naming.labels_csv else [])
    source = _videos_source(utf8_text(str(root)), videos, options, label_array, class_names, paths)
    if groups is not None:
        source.groups = np.repeat(groups, options.clips_per_video)  # one per clip, as the labels
        source.group_names, source.grouping = group_names, naming.provenance()
    return source


def _refuse_loose_images(folder: Path) -> None:
    """InputError when `folder`, whose entries are read as videos (files or folders of frames), holds
    image files itself: they are no video, and would be left out without a word."""
    images = images_in(folder)
    if images:
        raise InputError(utf8_text(f"{images[0]}: an image file where a video source has video files or folders of "
                                   "frames; move the images of that folder into a folder of their own (a clip) or "
                                   "out of the source"))


def file_source(path: Path, options: ClipOptions | None) -> Any:
    require_pyav()
    return _videos_source(utf8_text(str(path)), [path], (options or ClipOptions()).resolved(decoded=True), None, [],
                          [path])


def require_pyav():
    try:
        import av  # noqa: F401
    except ImportError:
        raise InputError(MISSING_PYAV) from None


def _videos_source(description: str, videos: list[Path], options: ClipOptions, labels, class_names, paths) -> Any:
    k = options.clips_per_video
    rates: list[float] = []
    attributes = clip_attributes(options, options.frames, None)

    @functools.lru_cache(maxsize=1)  # the K clips of one video are read one after another
    def frames_of(v: int) -> tuple[Callable, int, float | None]:
        video = videos[v]
        name = utf8_text(str(video))
        if video.is_dir():
            return video_decode.frame_folder(video, name)
        return video_decode.decode_file(video, name, options)

    checked: set[int] = set()

    def read(i: int):
        get, length, rate = frames_of(i // k)
        _check_length(utf8_text(str(videos[i // k])), length, options, attributes)
        if rate is not None and rate not in rates:
            rates.append(rate)
            attributes["fps"] = rates[0] if len(rates) == 1 else sorted(rates)
        if i // k not in checked:  # ingest checked the first video; a later one may be larger
            _check_clip_memory(videos[i // k], options)
            checked.add(i // k)
        return get(clip_indices(length, options)[i % k])

    def peek() -> tuple[int, ...] | None:
        frame = _frame_shape(videos[0])
        return None if frame is None else (options.frames, *frame)

    return video_source(description, len(videos) * k, read,
                        lambda i: _clip_name(utf8_text(str(videos[i // k])), i % k, k),
                        None if labels is None else _per_clip_labels(labels, k, description), class_names, paths,
                        attributes, peek)


def _check_clip_memory(video: Path, options: ClipOptions) -> None:
    """InputError naming `video` when one of its clips, decoded at its own size (from the headers),
    needs more memory than is available: before any of its frames is decoded."""
    frame = _frame_shape(video)
    if frame is None:
        return
    shape = "x".join(map(str, (options.frames, *frame)))
    resources.check_memory(utf8_text(str(video)), SAMPLES_IN_MEMORY * options.frames * math.prod(frame),
                       f"one clip is {shape} bytes at its own size; pass fewer --frames")


def _frame_shape(video: Path) -> tuple[int, int, int] | None:
    """[H, W, C] of a video's frames as ingest decodes them (C: 3 for a video file, 1 for gray frame
    images), from the container's or the first frame's header; None when it cannot be read (the clip's
    decoding then says why)."""
    try:
        if video.is_dir():
            from PIL import Image

            with Image.open(images_in(video)[0]) as image:
                return image.size[1], image.size[0], 1 if image.mode in GRAY_MODES else 3
        import av

        with av.open(str(video)) as container:
            context = container.streams.video[0].codec_context
            return (int(context.height), int(context.width), 3) if context.height and context.width else None
    except Exception:  # noqa: BLE001 - any unreadable header: decoding the clip reports it
        return None
