"""Listing the folders `jepa ingest` reads (image, video and audio folders alike).

Every listing here follows symbolic links to folders (a class folder may be a link), skips names
that start with "." (hidden files, macOS "._" companions), and turns a folder it cannot read into
an InputError naming that folder: a listing never drops part of a dataset without a word.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Iterator

from jepa_cli.data.store import utf8_text
from jepa_cli.errors import InputError

IMAGE_EXTENSIONS = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm"}
VIDEO_EXTENSIONS = {".mp4", ".webm", ".avi", ".mkv", ".mov", ".m4v", ".mpg", ".mpeg", ".ogv"}
AUDIO_EXTENSIONS = {".wav", ".flac", ".ogg"}


def _unreadable(folder: str | os.PathLike, exc: OSError) -> InputError:
    reason = exc.strerror or type(exc).__name__
    return InputError(utf8_text(f"{folder}: cannot list this folder ({reason}); make it readable, or move it out "
                                "of the source"))


def _names(folder: str | os.PathLike) -> list[tuple[str, bool]]:
    """(name, is a folder) of every entry of `folder` not starting with ".", unsorted; a link to a folder
    counts as a folder. InputError naming `folder` (or the entry) when it cannot be read, or when an
    image, video or audio file is a named pipe, a device or a socket (a decoder would wait on it)."""
    found = []
    try:
        with os.scandir(folder) as listing:
            for entry in listing:
                if entry.name.startswith("."):
                    continue
                try:
                    is_dir = entry.is_dir()  # the directory entry's type: a stat only for a link
                    special = (not is_dir and os.path.splitext(entry.name)[1].lower() in _KIND
                               and not entry.is_file() and os.path.exists(entry.path))  # a broken link is no pipe
                except OSError as exc:
                    raise _unreadable(entry.path, exc) from None
                if special:
                    raise InputError(utf8_text(f"{entry.path}: is not a regular file (a named pipe, a device or a "
                                               "socket); only regular files are read: move it out of the source"))
                found.append((entry.name, is_dir))
    except OSError as exc:
        raise _unreadable(folder, exc) from None
    return found


def entries(folder: str | os.PathLike) -> list[tuple[Path, bool]]:
    """(path, is a folder) of every entry of `folder` not starting with ".", sorted by name; a link to a
    folder counts as a folder. InputError naming `folder` (or the entry) when it cannot be read."""
    folder = Path(folder)
    return [(folder / name, is_dir) for name, is_dir in sorted(_names(folder))]


def subfolders(folder: str | os.PathLike) -> list[Path]:
    """The folders (and links to folders) in `folder`, by name, hidden ones left out."""
    return [path for path, is_dir in entries(folder) if is_dir]


def files_in(folder: str | os.PathLike, extensions: Iterable[str]) -> list[Path]:
    """The files in `folder` whose suffix (any case) is one of `extensions`, by name, hidden ones left out."""
    extensions, folder = set(extensions), Path(folder)
    return [folder / name for name, is_dir in sorted(_names(folder))
            if not is_dir and os.path.splitext(name)[1].lower() in extensions]


def _walk(folder: str, ancestors: frozenset = frozenset()) -> Iterator[tuple[str, str]]:
    """(folder, file name) of every file under `folder` at any depth, in sorted path order, reached
    through links to folders as through folders, as strings: listing a million files costs seconds,
    not minutes, without a Path per entry. A link back to a folder that holds it (a loop) is an
    InputError naming the link; so is a folder that cannot be listed."""
    try:
        info = os.stat(folder)
    except OSError as exc:
        raise _unreadable(folder, exc) from None
    key = (info.st_dev, info.st_ino)
    if key in ancestors:
        raise InputError(utf8_text(f"{folder}: is a link to a folder that holds it (a loop); remove the link "
                                   "or point it elsewhere"))
    for name, is_dir in sorted(_names(folder)):
        if is_dir:
            yield from _walk(os.path.join(folder, name), ancestors | {key})
        else:
            yield folder, name


def walk_files(root: str | os.PathLike, extensions: Iterable[str]) -> list[Path]:
    """The files under `root` (at any depth, `_walk`) whose suffix (any case) is one of `extensions`."""
    extensions = set(extensions)
    return [Path(folder, name) for folder, name in _walk(str(root)) if os.path.splitext(name)[1].lower() in extensions]


_KIND = {suffix: kind for kind, extensions in (("image", IMAGE_EXTENSIONS), ("video", VIDEO_EXTENSIONS),
                                                ("audio", AUDIO_EXTENSIONS)) for suffix in extensions}


def media_kind(path: Path) -> str | None:
    """"image", "video" or "audio" by the file's suffix; None for any other file."""
    return _KIND.get(path.suffix.lower())


def folder_holds_audio(root: str | os.PathLike) -> bool:
    """Whether the folder `root` is an audio source: it holds audio files at some depth. InputError when
    it also holds images or videos (naming one file of each): ingest reads one modality per folder, and
    would otherwise take one kind and leave the other out without a word."""
    first: dict[str, Path] = {}
    for folder, name in _walk(str(root)):
        kind = _KIND.get(os.path.splitext(name)[1].lower())
        if kind is not None and kind not in first:
            first[kind] = Path(folder, name)
            if "audio" in first and ("image" in first or "video" in first):
                break
    if "audio" in first:
        other = first.get("image") or first.get("video")
        if other is not None:
            raise InputError(utf8_text(f"{root}: holds both audio files ({first['audio']}) and {media_kind(other)} "
                                       f"files ({other}); a source is of one kind: move the other files out"))
        return True
    return False
