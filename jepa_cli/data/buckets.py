"""Artifacts in object storage (s3://, gs://), through TensorStore's kvstore drivers.

An object store has no rename, so an artifact is published as: every array object first, the
group's `zarr.json` last (`publish`). The group's `zarr.json` is the commit: a prefix holding
objects but no group `zarr.json` is an interrupted write, which readers refuse as incomplete
(`missing_group`) and the next write of that output removes (`clear`). A writer holds the output's
lease object, LEASE_KEY under its prefix (`locks.LeaseLock`), while it writes; the lease is no part
of the artifact: `keys` leaves it out and `clear` keeps it. A failed request is one line naming the
URL and the cause (`urls.failure`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Callable, Iterator

from jepa_cli.data.urls import BucketPath, failure
from jepa_cli.errors import InputError

GROUP_METADATA = "zarr.json"
LEASE_KEY = ".jepa-lease"  # the writer's lease object under an output's prefix (locks.LeaseLock)
UPLOADS_IN_FLIGHT = 16  # objects written at once while publishing (each up to one chunk, ~4 MiB)


def open_store(url: BucketPath):
    """The TensorStore KvStore of the prefix `url` (keys are relative to it)."""
    import tensorstore as ts

    try:
        return ts.KvStore.open(url.kvstore()).result()
    except ValueError as exc:
        raise failure(url, exc) from None


def result(url: BucketPath, future: Any) -> Any:
    """The result of the TensorStore future of a request to `url`; its failure as one line."""
    try:
        return future.result()
    except ValueError as exc:
        raise failure(url, exc) from None


def read_object(url: BucketPath, name: str) -> bytes | None:
    """The bytes of the object `name` under the prefix `url`, or None if there is none."""
    found = result(url, open_store(url).read(name))
    return found.value if found.state == "value" else None


def keys(url: BucketPath) -> list[str]:
    """Every key of the artifact under the prefix `url` (its writer's lease left out), relative to it, sorted."""
    found = (k.decode("utf-8", "surrogateescape") for k in result(url, open_store(url).list()))
    return sorted(key for key in found if key != LEASE_KEY)


def missing_group(url: BucketPath) -> InputError:
    """The error for a prefix without its group zarr.json: incomplete when it holds objects (an
    interrupted write), else absent."""
    if keys(url):
        return InputError(f"{url}: incomplete, its write did not finish (no {GROUP_METADATA}, which is written "
                          "last); write it again with the command that wrote it")
    return InputError(f"{url}: no such file or directory")


def local_files(root: Path) -> Iterator[tuple[str, Path]]:
    """(key, file) for every file under the folder `root`, key relative to it with `/`; sorted."""
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            file = Path(folder) / name
            yield file.relative_to(root).as_posix(), file


def publish(folder: Path, url: BucketPath, before_commit: Callable[[], None] = lambda: None,
            commit: str = GROUP_METADATA) -> None:
    """Uploads the finished folder `folder` (a zarr hierarchy, or a run's checkpoint step) to the prefix
    `url`: every object but its commit marker `commit` (the group's zarr.json) first (UPLOADS_IN_FLIGHT
    at a time), the marker last, once all the others are stored and `before_commit()` returned (the
    writer's lease confirmed). A failure or a signal before the last write leaves no marker, so readers
    never take the prefix for a complete artifact. FileNotFoundError when a file goes meanwhile."""
    store = open_store(url)
    in_flight: list[Any] = []  # TensorStore futures of the writes under way
    try:
        for key, file in local_files(folder):
            if key != commit:
                in_flight.append(store.write(key, file.read_bytes()))
            if len(in_flight) >= UPLOADS_IN_FLIGHT:
                result(url, in_flight.pop(0))
        while in_flight:
            result(url, in_flight.pop(0))
    finally:  # an error or a signal: let the writes already started end before the command does
        for future in in_flight:
            try:
                future.result()
            except BaseException:  # noqa: BLE001 - the first exception is the one reported
                pass
    before_commit()
    result(url, store.write(commit, (folder / commit).read_bytes()))


def clear(url: BucketPath) -> None:
    """Removes every object of the artifact under the prefix `url`: its group zarr.json first, so
    that a reader never finds a complete-looking artifact while its objects go. The writer's lease
    (LEASE_KEY) stays: the writer clearing the prefix holds it."""
    import tensorstore as ts

    store = open_store(url)
    result(url, store.delete_range(key_range(GROUP_METADATA)))
    result(url, store.delete_range(ts.KvStore.KeyRange("", LEASE_KEY)))
    result(url, store.delete_range(ts.KvStore.KeyRange(LEASE_KEY + "\0", "")))  # "": no upper bound


def key_range(key: str):
    """The KeyRange of the one object `key`."""
    import tensorstore as ts

    return ts.KvStore.KeyRange(key, key + "\0")


def prefix_range(prefix: str):
    """The KeyRange of every key that starts with `prefix` (not empty)."""
    import tensorstore as ts

    return ts.KvStore.KeyRange(prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1))


def fingerprint(url: BucketPath) -> str:
    """A SHA-256 of what the artifact at `url` holds, without reading its data: every key with its
    storage generation (S3's ETag, GCS's generation: a new write of an object gives a new one) and the
    bytes of every zarr.json (as `store.dataset_fingerprint` for a local folder)."""
    store = open_store(url)
    digest = hashlib.sha256()
    for key in keys(url):
        found = result(url, store.read(key, byte_range=slice(0, 0)))
        digest.update(key.encode("utf-8", "surrogateescape") + b"\0" + bytes(found.stamp.generation) + b"\0")
        if key == GROUP_METADATA or key.endswith("/" + GROUP_METADATA):
            digest.update(read_object(url, key) or b"")
    return digest.hexdigest()


def staging_root() -> Path:
    """The local folder (created if needed) where an output for a bucket is written before it is
    published: `jepa-staging` in the temporary directory (TMPDIR, else /tmp); it needs room for one
    output."""
    import tempfile

    root = Path(tempfile.gettempdir()) / "jepa-staging"
    root.mkdir(mode=0o700, exist_ok=True)
    return root


def staging_folder(url: BucketPath) -> Path:
    """The local folder (created if needed) that keeps the resumable partial of the bucket output
    `url` across runs, or the local mirror of a run in a bucket (training/bucket_run.py): named by a
    hash of the URL, so a rerun of the same command finds it."""
    folder = staging_root() / hashlib.sha256(str(url).encode()).hexdigest()[:16]
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder
