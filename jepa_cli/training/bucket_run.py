"""A training run in a bucket (`--out s3://BUCKET/RUN`, `gs://BUCKET/RUN`): trained in a local mirror,
uploaded as it goes.

The trainer writes its run directory as on a local disk, in a mirror of the bucket run in this host's
staging folder (`buckets.staging_folder`, under `run/`), and holds the bucket run's writer lease
(`locks.LeaseLock` on the run's prefix) from before the mirror is filled until the last upload, so
that no trainer on any host writes the run meanwhile; a second one is refused naming the holder.

`RunUpload.sync` copies what changed to the bucket, after the lease is confirmed:
- each checkpoint step that orbax has committed in the mirror and whose digest is written
  (`<step>/jepa_digest.json`): every file of the step first, its digest last. The digest object is
  the step's commit marker: a step without it in the bucket is an interrupted upload, which
  `--resume` ignores (`committed_steps`). A step the mirror rotated out (`--keep`) loses its
  marker first, then its other objects.
- run.json and metrics.jsonl, each as one whole object (a PUT replaces an object atomically); run.json
  goes first at the first sync, so a prefix holding a run's checkpoints holds its run.json too (a
  prefix holding objects but no run.json is another artifact, which `mirrored` refuses to write into).
The trainer syncs at each checkpoint save (which uploads the steps committed by then: with
asynchronous saves, the step being written goes up with the next save) and once more when it stops.

`--resume` downloads run.json, metrics.jsonl and the newest committed step into a fresh mirror and
resumes there as a local run does (metrics.jsonl is cut back to the restored step).

The commands that read a run's weights (encode-latents, probe --run) read a bucket run the same way:
`readable_run` downloads run.json, metrics.jsonl and the committed steps they read into a fresh copy,
without the lease (they read the steps committed when they start), and removes it afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from jepa_cli.data import buckets
from jepa_cli.data.files import parse_json
from jepa_cli.data.locks import LeaseLock
from jepa_cli.data.urls import BucketPath, is_bucket, location
from jepa_cli.errors import InputError, JepaError
from jepa_cli.training.digest import DIGEST_FILE
from jepa_cli.training.runfiles import METRICS_FILE, RUN_FILE, is_step_name, parse_run

CHECKPOINTS = "checkpoints"  # RUN/<this>/<step>/..., as in a local run (training/checkpoint.py)


def bucket_run(out: str | None) -> BucketPath | None:
    """The bucket URL `out` names, or None for a local run (a malformed URL is an InputError)."""
    where = location(out) if out else None
    return where if isinstance(where, BucketPath) else None


def busy_bucket_run(url: BucketPath, holder: str) -> InputError:
    """The refusal of a second trainer of the bucket run `url`, naming the holder of its lease."""
    return InputError(f"{url}: another process ({holder}) is training in this run (it holds {url}/{buckets.LEASE_KEY}); "
                      "wait for it to finish or stop it (a killed trainer's lease expires within a minute)")


def committed_steps(url: BucketPath) -> list[int]:
    """The checkpoint steps of the bucket run `url` whose upload finished (their digest object is there)."""
    return sorted(int(parts[1]) for parts in (key.split("/") for key in buckets.keys(url))
                  if len(parts) == 3 and parts[0] == CHECKPOINTS and is_step_name(parts[1]) and parts[2] == DIGEST_FILE)


class RunUpload:
    """Copies the mirror `mirror` of the bucket run `url` to the bucket (the module's description),
    under the writer lease `lease`."""

    def __init__(self, mirror: Path, url: BucketPath, lease: LeaseLock, replace: bool) -> None:
        self.mirror, self.url, self.lease = mirror, url, lease
        self.replace = replace  # a new or forced run: the bucket's objects go at the first sync, not before
        # the steps committed in the bucket that this upload follows: those in the mirror when it starts
        # (a resumed run's newest step); older ones of the bucket stay as they are
        self.uploaded: set[int] = set(self._committed_in_mirror())
        self.sent: dict[str, bytes] = {}  # run.json and metrics.jsonl as last uploaded

    def sync(self) -> None:
        """Uploads the steps committed in the mirror and not yet in the bucket, removes the steps the mirror
        rotated out, then uploads run.json and metrics.jsonl if they changed. InputError when the lease was lost."""
        self.lease.confirm()
        store = buckets.open_store(self.url)
        if self.replace:
            buckets.clear(self.url)
            self.replace = False
        if RUN_FILE not in self.sent:  # first: a prefix holding checkpoints but no run.json is no run
            self._send(store, RUN_FILE)
        local = self._committed_in_mirror()
        for step in sorted(set(local) - self.uploaded):
            try:
                buckets.publish(self.mirror / CHECKPOINTS / str(step), self.url / CHECKPOINTS / str(step),
                                self.lease.confirm, commit=DIGEST_FILE)
                self.uploaded.add(step)
            except FileNotFoundError:  # rotated out (--keep) by orbax while it was read: never committed
                buckets.result(self.url, store.delete_range(buckets.prefix_range(f"{CHECKPOINTS}/{step}/")))
        for step in sorted(self.uploaded - set(local)):
            if (self.mirror / CHECKPOINTS / str(step)).exists():
                continue  # being rewritten in the mirror: replaced once committed there
            prefix = f"{CHECKPOINTS}/{step}/"
            buckets.result(self.url, store.delete_range(buckets.key_range(prefix + DIGEST_FILE)))
            buckets.result(self.url, store.delete_range(buckets.prefix_range(prefix)))
            self.uploaded.discard(step)
        for name in (RUN_FILE, METRICS_FILE):
            self._send(store, name)

    def _send(self, store: Any, name: str) -> None:
        """Uploads the mirror's file `name` (run.json, metrics.jsonl) as one object if it changed since last sent."""
        path = self.mirror / name
        if not path.is_file():
            return
        data = path.read_bytes()
        if name == RUN_FILE:
            data = _with_bucket_out(data, self.url)
        if self.sent.get(name) != data:
            buckets.result(self.url, store.write(name, data))
            self.sent[name] = data

    def _committed_in_mirror(self) -> list[int]:
        """The steps of the mirror that orbax committed (renamed from its temporary folder) and that hold their digest."""
        folder = self.mirror / CHECKPOINTS
        if not folder.is_dir():
            return []
        return sorted(int(p.name) for p in folder.iterdir() if is_step_name(p.name) and (p / DIGEST_FILE).is_file())


def _with_bucket_out(data: bytes, url: BucketPath) -> bytes:
    """run.json's bytes with its recorded `config.out` set to the bucket URL (the mirror's path is this
    host's business only)."""
    try:
        record = json.loads(data)
    except ValueError:
        return data
    if isinstance(record, dict) and isinstance(record.get("config"), dict):
        record["config"]["out"] = str(url)
        return json.dumps(record, indent=2).encode()
    return data


def read_bucket_run(url: BucketPath) -> dict[str, Any] | None:
    """The run.json record of the bucket run `url` (runfiles.parse_run), or None when it has none."""
    data = buckets.read_object(url, RUN_FILE)
    if data is None:
        return None
    return parse_run(lambda: parse_json(data, f"{url}/{RUN_FILE}"), f"{url}/{RUN_FILE}")


def download_run(url: BucketPath, mirror: Path, steps: list[int]) -> None:
    """Fills the empty folder `mirror` with run.json, metrics.jsonl and the checkpoints `steps` of `url`."""
    names = [RUN_FILE, METRICS_FILE]
    if steps:
        wanted = tuple(f"{CHECKPOINTS}/{step}/" for step in steps)
        names += [key for key in buckets.keys(url) if key.startswith(wanted)]
    for name in names:
        data = buckets.read_object(url, name)
        if data is not None:
            target = mirror / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)


@contextlib.contextmanager
def mirrored(url: BucketPath, resume: bool, force: bool) -> Iterator[RunUpload]:
    """Holds the lease of the bucket run `url` for the block and gives its upload, whose `mirror` is a
    fresh local mirror: with `resume`, filled with the run's files and newest committed step. A prefix
    holding objects but no run.json is refused (it is another artifact). A run with committed steps is refused unless resumed or forced (as a local run); a new or forced run's objects
    are removed at its first sync (once the trainer has checked its inputs and written the run). The
    lease goes when the block ends."""
    lease = LeaseLock(url, refusal=lambda holder: busy_bucket_run(url, holder))
    with lease.held():
        found = buckets.keys(url)
        if found and RUN_FILE not in found:
            raise InputError(f"{url}: holds objects and is not a training run (refusing to write into it)")
        steps = committed_steps(url)
        if steps and not resume and not force:
            raise InputError(f"{url}: already holds a run (use --resume to continue it or --force to replace it)")
        mirror = buckets.staging_folder(url) / "run"
        shutil.rmtree(mirror, ignore_errors=True)
        mirror.mkdir()
        if resume:
            download_run(url, mirror, steps[-1:])
        upload = RunUpload(mirror, url, lease, replace=not resume)
        try:
            yield upload
        finally:
            shutil.rmtree(mirror, ignore_errors=True)


@contextlib.contextmanager
def readable_run(run: str | os.PathLike, step: int | str | None = None) -> Iterator[Path]:
    """The local folder a command that reads the run `run` reads, for the block: `run` itself when it is
    local; for a bucket URL, a fresh copy in this host's staging folder holding its run.json,
    metrics.jsonl and committed checkpoint `step` (None: the newest; "all": every one), removed when
    the block ends. An error the block raises (JepaError: one line for the user) names the URL where it
    would name the copy, which is this host's business only."""
    if not is_bucket(run):
        yield Path(run)
        return
    url = location(run)
    assert isinstance(url, BucketPath)
    if buckets.read_object(url, RUN_FILE) is None:
        raise InputError(f"{url}: not a training run (no {RUN_FILE})")
    steps = committed_steps(url)
    if not steps:
        raise InputError(f"{url}: holds no checkpoint yet")
    if step not in (None, "all") and step not in steps:
        raise InputError(f"{url}: no checkpoint at step {step} (checkpoints: {', '.join(map(str, steps))})")
    wanted = steps if step == "all" else steps[-1:] if step is None else [int(step)]
    with tempfile.TemporaryDirectory(prefix="read-", dir=buckets.staging_folder(url)) as folder:
        copy = Path(folder) / "run"
        copy.mkdir()
        download_run(url, copy, wanted)
        try:
            yield copy
        except JepaError as exc:
            exc.args = tuple(arg.replace(str(copy), str(url)) if isinstance(arg, str) else arg for arg in exc.args)
            raise
