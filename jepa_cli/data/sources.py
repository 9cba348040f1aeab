"""Where `jepa ingest` reads samples from: image folders or files, .npy/.npz arrays, IDX files, built-ins.

A `Source` (data/samples.py) knows how many samples it has and their labels up front (cheap: file listings and
label files only) and decodes one sample at a time, so a folder of a million images is never
held in memory.
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from jepa_cli.data import folders, labels, moving_digits, resources, video
from jepa_cli.data.digits import load_digit_images
from jepa_cli.data.files import check_regular
from jepa_cli.data.folders import IMAGE_EXTENSIONS
from jepa_cli.data.labels import Naming
from jepa_cli.data.pixels import to_uint8
from jepa_cli.data.samples import BadSample, Source
from jepa_cli.data.store import utf8_text
from jepa_cli.errors import InputError
from jepa_cli.names import BUILTIN_SOURCES

BUILTINS = {
    "digits": "1,797 real 8x8 grayscale handwritten digits, 10 classes (ships with scikit-learn, no download)",
    "moving-digits": "video: 1,797 clips of a built-in digit bouncing in 32x32 over 16 frames, labels = digit "
                     "(?label=direction: 4 motion directions; ?digits=2: a second digit; ?size=64)",
    "tones": "300 synthetic audio clips of 1-2 s, 10 classes (tones, chirps, noise bands; made at --sample-rate)",
}
assert tuple(BUILTINS) == BUILTIN_SOURCES
IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
              0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def open_source(spec: str, labels_path: str | None = None, clip: Any = None, *, label_regex: str | None = None,
                group_regex: str | None = None, group_column: str | None = None) -> Source:
    """Opens `spec`: `builtin:NAME`, a folder of images, one image, a .npy/.npz file or an IDX file (maybe .gz),
    or video (data/video.py): a video file, a folder of videos or frame folders, a [N, T, H, W, C]
    array. `clip` (clips.ClipOptions) says how clips are cut; set options are refused for images.
    `labels_path` is a label file of an array source, or a labels CSV of a folder; `label_regex`,
    `group_regex` and `group_column` name a folder's items (data/labels.py)."""
    source = _open_source(spec, labels_path, clip, label_regex, group_regex, group_column)
    if source.codec is None and clip is not None and clip.explicit:
        raise InputError(f"{spec}: --frames, --frame-stride and --clips-per-video apply to video sources only")
    return source


def _open_source(spec: str, labels_path: str | None, clip: Any, label_regex: str | None, group_regex: str | None,
                 group_column: str | None) -> Source:
    path = Path(spec)
    if path.is_dir() and not spec.startswith("builtin:"):
        naming = Naming(labels_path, label_regex, group_regex, group_column)
        if video.is_video_folder(path, clip is not None and clip.explicit):
            return video.folder_source(path, clip, naming)
        source = _image_folder(path, naming)
        source.paths = [path] + ([Path(labels_path)] if labels_path else [])
        return source
    for flag, value in (("--label-regex", label_regex), ("--group-regex", group_regex),
                        ("--group-column", group_column)):
        if value is not None:
            raise InputError(f"{flag} applies to a folder source, whose file names it reads; {spec} is not one")
    if labels_path is not None and labels_path.lower().endswith(".csv"):
        raise InputError(f"--labels {labels_path}: a CSV of path,label rows labels the files of a folder source; "
                         f"{spec} is not one (an array source takes .npy, .txt or IDX labels)")
    if spec.startswith("builtin:"):
        if labels_path:
            raise InputError("--labels does not apply to a builtin: source")
        name, _, query = spec.removeprefix("builtin:").partition("?")
        if name == "moving-digits":
            if clip is not None and clip.explicit:
                raise InputError(f"{spec}: --frames, --frame-stride and --clips-per-video do not apply to it (its clips "
                                 f"are {moving_digits.MOVING_FRAMES} frames, one per digit)")
            return moving_digits.moving_digits(query)
        return _builtin(spec.removeprefix("builtin:"))
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    name = path.name.lower()
    if video.is_video_file(path):
        source = video.file_source(path, clip)
    elif name.endswith(".npz"):
        source = _npz(path, clip)
    elif name.endswith(".npy"):
        source = _array_source(path, load_npy(path), str(path), clip)
    elif path.suffix.lower() in IMAGE_EXTENSIONS:
        source = _image_files(path, [path], None, [])  # one image: a dataset of one sample
    else:
        source = _array_source(path, read_idx(path, SOURCE_KINDS), str(path))
    source.paths = [path]
    if labels_path is not None:
        source.labels, source.class_names = _labels_with_names(load_labels(labels_path), labels_path)
        source.paths.append(Path(labels_path))
    if source.labels is not None and source.codec is not None:
        source.labels = video.per_clip(source.labels, source)
    if source.labels is not None and len(source.labels) != source.count:
        where = labels_path or str(path)
        raise InputError(f"{where}: {len(source.labels)} labels for {source.count} samples")
    return source


def _builtin(name: str) -> Source:
    if name not in BUILTINS:
        raise InputError(f"builtin:{name}: unknown built-in source (known: {', '.join('builtin:' + n for n in BUILTINS)})")
    if name == "tones":  # audio: jepa_cli.data.tones.tones_source
        raise InputError("builtin:tones is an audio source (jepa_cli.data.audio.open_audio_source)")
    images, labels, class_names = load_digit_images()
    source = _array_source(Path("builtin:digits"), images, "builtin:digits")
    source.labels, source.class_names = labels, class_names
    return source


def _image_folder(root: Path, naming: Naming) -> Source:
    """ROOT/<class>/* (labelled by folder) or ROOT/* (unlabelled), relabelled or grouped as `naming` says."""
    files, label_array, class_names = _image_folder_listing(root)
    if naming.relabels or naming.grouped:
        named = labels.name_items(root, files, naming, "image files", None)
        if naming.relabels:
            label_array, class_names = labels.class_ids(named.labels)
        source = _image_files(root, files, label_array, class_names)
        source.groups, source.group_names = labels.class_ids(named.groups)
        source.grouping = naming.provenance() if naming.grouped else None
        return source
    return _image_files(root, files, label_array, class_names)


def _image_folder_listing(root: Path) -> tuple[list[Path], np.ndarray | None, list[str]]:
    """The image files of a folder, their labels by class folder (None when flat) and the class names."""
    subdirs = folders.subfolders(root)
    if subdirs:
        files: list[Path] = []
        labels: list[int] = []
        class_names = [d.name for d in subdirs]
        for label, subdir in enumerate(subdirs):
            found = _list_images(subdir)
            files += found
            labels += [label] * len(found)
        label_array: np.ndarray | None = np.asarray(labels, dtype=np.int32)
    else:
        files, class_names, label_array = _list_images(root), [], None
    if not files:
        raise InputError(f"{root}: no image files found ({', '.join(sorted(IMAGE_EXTENSIONS))}), nor audio files "
                         "(.flac, .ogg, .wav) at any depth")
    return files, label_array, class_names


def _image_files(where: Path, files: list[Path], label_array: np.ndarray | None, class_names: list[str]) -> Source:
    """The images `files` (decoded one at a time by Pillow) as a source described as `where`."""

    def read(i: int):
        from PIL import Image

        try:
            image = Image.open(files[i])
            image.load()
        except Exception as exc:  # noqa: BLE001 - Pillow raises many kinds for a corrupt file
            raise BadSample(utf8_text(f"{files[i]}: cannot decode image ({type(exc).__name__}: {exc})")) from None
        return image

    # names as UTF-8 (store.utf8_text): they reach attributes, --json and error messages
    return Source(utf8_text(str(where)), len(files), read, lambda i: utf8_text(str(files[i])), label_array,
                  utf8_text(class_names))


def _list_images(folder: Path) -> list[Path]:
    return folders.files_in(folder, IMAGE_EXTENSIONS)


def load_npy(path: Path) -> np.ndarray:
    """A .npy file, memory-mapped; InputError naming the file if it is truncated, not a .npy, or
    holds Python objects (which would need pickle: never loaded)."""
    check_regular(path)
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - numpy raises ValueError, OSError, EOFError, ... for a bad file
        raise InputError(f"{path}: not a readable .npy file ({_one_line(exc)}); re-save it with numpy.save "
                         "(numeric dtype)") from None
    if not isinstance(array, np.ndarray):
        raise InputError(f"{path}: not a .npy file (it looks like a .npz archive; name it .npz)")
    return array


def _npz(path: Path, clip: Any = None) -> Source:
    check_regular(path)
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{path}: cannot read .npz ({_one_line(exc)})") from None
    if not hasattr(archive, "keys"):
        raise InputError(f"{path}: not a .npz archive (it looks like a .npy file; name it .npy)")
    keys = list(archive.keys())
    image_key = next((k for k in ("inputs", "images", "x", "x_train", "data") if k in keys),
                     next((k for k in keys if k not in ("labels", "y", "targets")), None))
    if image_key is None:
        raise InputError(f"{path}: no image array in the .npz (keys: {', '.join(keys)})")
    source = _array_source(path, _npz_member(archive, path, image_key), f"{path}[{image_key}]", clip)
    label_key = next((k for k in ("labels", "y", "targets", "y_train") if k in keys), None)
    if label_key is not None:
        source.labels, source.class_names = _labels_with_names(_npz_member(archive, path, label_key),
                                                               f"{path}[{label_key}]")
    return source


def _npz_member(archive, path: Path, key: str) -> np.ndarray:
    """One array of a .npz; InputError naming the file and key if it is truncated, corrupt or holds objects,
    or if the memory its header announces is more than is available (it is decompressed whole)."""
    announced = _npz_member_bytes(archive, key)
    if announced is not None:
        resources.check_memory(f"{path}[{key}]", announced, "a .npz array is decompressed whole; save it as .npy, "
                           "which is read a sample at a time")
    try:
        return archive[key]
    except Exception as exc:  # noqa: BLE001 - zipfile, zlib and numpy errors alike
        raise InputError(f"{path}[{key}]: cannot read this array of the .npz ({_one_line(exc)}); re-save it "
                         "with numpy.savez (numeric dtypes)") from None


def _npz_member_bytes(archive, key: str) -> int | None:
    """Bytes of the array `key` of an open .npz as its .npy header states them (shape x item size), read
    without decompressing the data; None when the header cannot be read (loading it then says why)."""
    try:
        with archive.zip.open(f"{key}.npy") as member:
            version = np.lib.format.read_magic(member)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, _fortran, dtype = read_header(member)
        return math.prod(shape) * dtype.itemsize
    except Exception:  # noqa: BLE001 - zipfile, zlib and numpy errors alike
        return None


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:200]


def _array_source(path: Path, array: np.ndarray, description: str, clip: Any = None) -> Source:
    if array.ndim == 5:  # [N, T, H, W, C] clips
        return video.array_source(path, array, description, clip)
    if array.ndim not in (3, 4) or (array.ndim == 4 and array.shape[-1] not in (1, 3, 4)):
        raise InputError(f"{path}: expected images [N, H, W] or [N, H, W, C] with C in 1, 3, 4; got shape {list(array.shape)}")
    if not (array.dtype == np.bool_ or np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)):
        raise InputError(f"{path}: pixels must be numbers (bool, integer or float), got dtype {array.dtype}")

    def read(i: int) -> np.ndarray:
        return to_uint8(np.asarray(array[i]), f"{path}[{i}]")

    return Source(description, int(array.shape[0]), read, lambda i: f"{path}[{i}]")


SOURCE_KINDS = (f"SOURCE may be a folder of images, an image file ({', '.join(sorted(IMAGE_EXTENSIONS))}), "
                "a .npy or .npz array, an IDX file (maybe .gz), a video file or folder, a folder of audio files "
                "or builtin:NAME")  # every file that matches none of the others is read as IDX


def read_idx(path: Path, otherwise: str = "") -> np.ndarray:
    """Reads an IDX file (MNIST's format), gzipped or not: magic 0x0000TTDD, then DD big-endian sizes.
    `otherwise` ends the message of a file that is not IDX (what else the file could have been).

    The data is read only after the memory its header announces has been checked (a small .gz may
    unpack to gigabytes), and never past those bytes."""
    tail = f"; {otherwise}" if otherwise else ""
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rb") as handle:
            magic = handle.read(4)
            if len(magic) < 4:
                raise InputError(f"{path}: not an IDX file (too short){tail}")
            zero, type_code, ndim = struct.unpack(">HBB", magic)
            if zero != 0 or type_code not in IDX_DTYPES or not 1 <= ndim <= 4:
                raise InputError(f"{path}: not an IDX file (wrong magic number 0x{magic.hex()}){tail}")
            sizes = handle.read(4 * ndim)
            if len(sizes) < 4 * ndim:
                raise InputError(f"{path}: not an IDX file (too short){tail}")
            shape = struct.unpack(f">{ndim}I", sizes)
            dtype = np.dtype(IDX_DTYPES[type_code])
            expected = math.prod(shape) * dtype.itemsize
            resources.check_memory(path, 2 * expected, f"its header says {list(shape)} ({expected} bytes), which "
                               "ingest holds in memory at once; convert it to .npy, which is read a sample at a time")
            data = handle.read(expected + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{path}: cannot read ({exc})") from None
    if len(data) != expected:
        follow = f"more than {expected}" if len(data) > expected else str(len(data))
        raise InputError(f"{path}: IDX header says {list(shape)} ({expected} bytes) but {follow} bytes follow")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def load_labels(path_str: str) -> np.ndarray:
    """Labels from a .npy, .txt (one per line) or IDX file."""
    path = Path(path_str)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    name = path.name.lower()
    if name.endswith(".npy"):
        labels = load_npy(path)
    elif name.endswith(".txt"):
        check_regular(path)
        try:
            labels = np.loadtxt(path, dtype=np.int64, ndmin=1)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: not a text file of integer labels, one per line ({_one_line(exc)})") from None
    else:
        labels = read_idx(path)
    if labels.ndim != 1:
        raise InputError(f"{path}: labels must be one-dimensional, got shape {list(labels.shape)}")
    return labels


def _labels_with_names(labels: np.ndarray, where: str) -> tuple[np.ndarray, list[str]]:
    """Integer labels 0..K-1 and their class names (the distinct values, sorted)."""
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise InputError(f"{where}: labels must be one-dimensional, got shape {list(labels.shape)}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise InputError(f"{where}: labels must be integers, got {labels.dtype}")
    if labels.size and labels.min() < 0:
        raise InputError(f"{where}: negative label {labels.min()}")
    num_classes = int(labels.max()) + 1 if labels.size else 0
    return labels.astype(np.int32), [str(i) for i in range(num_classes)]
