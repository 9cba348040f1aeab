"""Video sources for `jepa ingest`: clip arrays, folders of frame images, video files (PyAV), and
`builtin:moving-digits`. Every one yields clips uint8 [T, H, W, C] (docs/formats.md, "Video").

A video (a file, a folder of frames, or one row of a [N, T, H, W, C] array) gives `clips_per_video`
clips of `frames` frames taken every `frame_stride` frames, their starts evenly spaced over the
video. A video shorter than one clip's span, (frames - 1) x stride + 1, is padded by repeating its
last frame (listed in the dataset's `padded` attribute), or skipped with --skip-bad.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jepa_cli.data import folders
from jepa_cli.data.folders import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS
from jepa_cli.data.store import utf8_text
from jepa_cli.errors import InputError

DEFAULT_FRAMES, DEFAULT_STRIDE = 16, 4  # V-JEPA configs/pretrain/vitl16.yaml: num_frames 16, sampling_rate 4
MISSING_PYAV = "decoding video files needs PyAV: pip install 'jepa-cli[video]'"
MAX_CLIP_FRAMES = 1 << 16  # 36 minutes at 30 fps in one clip
INDEX_BYTES = 24  # per clip: its int32 label, its int64 row index and temporaries while they are computed


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


# -- how ingest converts and resizes clips (data/ingest.py dispatches on Source.codec) -------------
class ClipCodec:
    """How ingest converts a video source's samples: clips uint8 [T, H, W, C], every frame resized."""

    modality = "video"
    layout = "NTHWC"

    @staticmethod
    def pixels(sample: Any, channels: int | None, name: str) -> np.ndarray:
        """A clip (array [T, H, W(, C)] or list of frames, PIL or arrays) as uint8 [T, H, W, C]."""
        from jepa_cli.data.ingest import to_pixels

        frames = [to_pixels(f, channels, name) for f in sample]
        if not frames:
            from jepa_cli.data.sources import BadSample

            raise BadSample(f"{name}: the clip has no frames")
        if channels is None and len({f.shape[-1] for f in frames}) > 1:  # gray and colour frames mixed
            frames = [to_pixels(f, 3, name) for f in frames]
        first = frames[0].shape
        for i, f in enumerate(frames):
            if f.shape != first:
                from jepa_cli.data.sources import BadSample

                raise BadSample(f"{name}: frame {i} is {f.shape[0]}x{f.shape[1]} but frame 0 is "
                                f"{first[0]}x{first[1]} (every frame of a clip must have one size)")
        return np.stack(frames)

    @staticmethod
    def fit(clip: np.ndarray, size: tuple[int, int] | None) -> np.ndarray:
        from jepa_cli.data.ingest import fit

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


def _attributes(options: ClipOptions, frames: int, fps: float | None) -> dict[str, Any]:
    return {"frames": int(frames), "frame_stride": int(options.frame_stride), "fps": fps,
            "clips_per_video": int(options.clips_per_video), "padded": []}


def _source(description, count, read, item_name, labels=None, class_names=(), paths=(), attributes=None, peek=None):
    from jepa_cli.data.sources import Source

    return Source(description, count, read, item_name, labels, list(class_names), list(paths),
                  codec=ClipCodec, attributes=attributes or {}, peek=peek)


def _per_clip_labels(labels: np.ndarray, k: int, where: str) -> np.ndarray:
    """`labels` (one per video) repeated for each of the video's `k` clips; InputError naming `where`
    when the clips' labels and indices alone need more memory than is available."""
    from jepa_cli.data import resources

    clips = len(labels) * k
    resources.check_memory(where, clips * (4 + INDEX_BYTES), f"{len(labels)} video(s) x --clips-per-video {k} = "
                       f"{clips} clips; pass a smaller --clips-per-video")
    return np.repeat(labels, k)


# -- arrays [N, T, H, W, C] --------------------------------------------------------------------
def array_source(path: Path, array: np.ndarray, description: str, options: ClipOptions | None) -> Any:
    """Each row of a [N, T, H, W, C] array is a video; K clips per row (the whole row by default)."""
    from jepa_cli.data.sources import to_uint8

    if array.shape[-1] not in (1, 3, 4):
        raise InputError(f"{path}: expected clips [N, T, H, W, C] with C in 1, 3, 4; got shape {list(array.shape)}")
    if array.shape[1] == 0:
        raise InputError(f"{path}: the clips have zero frames (shape {list(array.shape)})")
    if not (array.dtype == np.bool_ or np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)):
        raise InputError(f"{path}: pixels must be numbers (bool, integer or float), got dtype {array.dtype}")
    options = (options or ClipOptions()).resolved(decoded=False)
    length, k = int(array.shape[1]), options.clips_per_video
    attributes = _attributes(options, options.frames or length, None)

    def read(i: int) -> np.ndarray:
        row, clip = divmod(i, k)
        name = _clip_name(f"{path}[{row}]", clip, k)
        _check_length(name, length, options, attributes)
        return to_uint8(np.asarray(array[row][clip_indices(length, options)[clip]]), name)

    def peek() -> tuple[int, ...]:
        return (options.frames or length, *array.shape[2:4], 1 if array.shape[-1] == 1 else 3)

    return _source(description, int(array.shape[0]) * k, read,
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
    from jepa_cli.data.sources import BadSample

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
def _natural(path: Path):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def _images_in(folder: Path) -> list[Path]:
    return sorted(folders.files_in(folder, IMAGE_EXTENSIONS), key=_natural)


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
        if _videos_in(sub) or any(_images_in(clip) for clip in _subdirs(sub)):
            return True
    return False


def folder_source(root: Path, options: ClipOptions | None) -> Any:
    """ROOT/<class>/<video file or frame folder> (labelled) or ROOT/<video file or frame folder>."""
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
    return _videos_source(utf8_text(str(root)), videos, options, label_array, utf8_text(class_names), [root])


def _refuse_loose_images(folder: Path) -> None:
    """InputError when `folder`, whose entries are read as videos (files or folders of frames), holds
    image files itself: they are no video, and would be left out without a word."""
    images = _images_in(folder)
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
    attributes = _attributes(options, options.frames, None)

    @functools.lru_cache(maxsize=1)  # the K clips of one video are read one after another
    def frames_of(v: int) -> tuple[Callable, int, float | None]:
        video = videos[v]
        name = utf8_text(str(video))
        return _frame_folder(video, name) if video.is_dir() else _decode(video, name, options)

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

    return _source(description, len(videos) * k, read,
                   lambda i: _clip_name(utf8_text(str(videos[i // k])), i % k, k),
                   None if labels is None else _per_clip_labels(labels, k, description), class_names, paths,
                   attributes, peek)


def _check_clip_memory(video: Path, options: ClipOptions) -> None:
    """InputError naming `video` when one of its clips, decoded at its own size (from the headers),
    needs more memory than is available: before any of its frames is decoded."""
    from jepa_cli.data import resources
    from jepa_cli.data.ingest import SAMPLES_IN_MEMORY

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

            from jepa_cli.data.ingest import GRAY_MODES

            with Image.open(_images_in(video)[0]) as image:
                return image.size[1], image.size[0], 1 if image.mode in GRAY_MODES else 3
        import av

        with av.open(str(video)) as container:
            context = container.streams.video[0].codec_context
            return (int(context.height), int(context.width), 3) if context.height and context.width else None
    except Exception:  # noqa: BLE001 - any unreadable header: decoding the clip reports it
        return None


def _frame_folder(folder: Path, name: str) -> tuple[Callable, int, None]:
    """A folder of frame images in natural name order (frame2 before frame10)."""
    files = _images_in(folder)

    def frames_of(idx: np.ndarray) -> list:
        from PIL import Image

        from jepa_cli.data.sources import BadSample

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


def _decode(path: Path, name: str, options: ClipOptions) -> tuple[Callable, int, float | None]:
    """A video file's frame count and rate, and a reader of the frames its clips need: one decoding
    pass keeps only those frames (RGB), so memory holds K x F frames, never the whole video. The count
    is the container's, or one counting pass when it has none; frames the file turns out not to have
    repeat the last one decoded. FFmpeg decodes with its own threads over the cores."""
    import av

    from jepa_cli.data.sources import BadSample

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


# -- builtin:moving-digits ---------------------------------------------------------------------
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
    from jepa_cli.data.sources import load_digit_images

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
                y, x = (_bounce(start[i, d, a] + velocity[i, d, a] * t, room) for a in range(2))
                view = clip[t, y:y + glyph, x:x + glyph, 0]
                np.maximum(view, g, out=view)
        return clip

    spec = "builtin:moving-digits" + (f"?{query}" if query else "")
    if options["label"] == "digit":
        labels, names = digit_labels, digit_names
    else:
        labels, names = direction[:, 0].astype(np.int32), list(DIRECTIONS)
    attributes = _attributes(ClipOptions(MOVING_FRAMES, 1, 1), MOVING_FRAMES, None)
    return _source(spec, n, read, lambda i: f"{spec}[{i}]", labels, names, [], attributes,
                   lambda: (MOVING_FRAMES, size, size, 1))


def _bounce(p: int, room: int) -> int:
    """Position p reflected into [0, room] (a bounce off each wall)."""
    if room == 0:
        return 0
    m = int(p) % (2 * room)
    return m if m <= room else 2 * room - m


# -- pictures (`jepa info DATA --png`) ---------------------------------------------------------
def write_strip_png(data: str | Path, png: str | Path, samples: int, force: bool = False) -> str:
    """A PNG of the first `samples` samples of a dataset: one row of frames per clip (an image is a
    one-frame clip), frames scaled up to at least 64 pixels high; written atomically (atomic.write_file)."""
    import io

    from PIL import Image

    from jepa_cli.data import atomic
    from jepa_cli.masks.render import preview_images

    atomic.check_output_file(png, force, atomic.PNG_MAGIC, "PNG picture")
    atomic.check_disjoint(png, [data])
    x = preview_images(str(data), samples)  # uint8 [n, (T,) H, W, 3]
    if x.ndim == 4:
        x = x[:, None]
    n, t, h, w, _ = x.shape
    scale = max(1, -(-64 // h))
    gap = 2 * scale
    picture = np.full((n * (h * scale + gap) - gap, t * (w * scale + gap) - gap, 3), 255, np.uint8)
    for i in range(n):
        for f in range(t):
            tile = np.kron(x[i, f], np.ones((scale, scale, 1), np.uint8))
            top, left = i * (h * scale + gap), f * (w * scale + gap)
            picture[top:top + h * scale, left:left + w * scale] = tile
    buffer = io.BytesIO()
    Image.fromarray(picture).save(buffer, format="PNG")
    atomic.write_file(png, buffer.getvalue(), force, atomic.PNG_MAGIC, "PNG picture")
    return str(png)
