"""Orbax checkpoints under RUN/checkpoints/<step>/: state, data iterator state, resolved config,
package versions. Orbax writes each step to a temporary directory and renames it when complete, so
a half-written checkpoint is never listed, hence never restored. A complete checkpoint whose files
were damaged later (truncated, overwritten, a flipped byte) is an UnreadableCheckpoint naming its step;
readers that want "the latest" fall back to the newest one that reads back (restore_newest).

Integrity: once a step is committed, process 0 writes `<step>/jepa_digest.json` (atomically): the
SHA-256 of every file of the step's items. A restore compares the files with it before reading
them, so damage that would still decode (a flipped byte in an uncompressed chunk) is caught. A step
without the file (one written before digests existed, or read in the moment between its commit and
its digest) restores unchecked. A step that disappears while it is read (a trainer with `--keep`
rotated it out) is not damage: restore_newest goes on with the newest step there is then."""

from __future__ import annotations

import functools
import importlib.metadata
import json
import threading
import time
from pathlib import Path
from typing import Any, Callable

import jax

from jepa_cli.errors import InputError
from jepa_cli.training.digest import ITEMS, digest_problem, write_digest
from jepa_cli.training.runfiles import is_step_name
from jepa_cli.training.abandoned_reads import settle_abandoned_reads_at_exit, silence_abandoned_reads

UNREADABLE_DIR = "unreadable-checkpoints"  # RUN/<this>/<step>: where a resume moves damaged checkpoints
# Orbax splits each replicated array across its replicas to write it in parallel; every split is an
# eager slice, compiled once per shape (36 compiles, about 1.8 s, on a 2-block model with 4 replicas
# on CPU). Below this many bytes per slice one replica writes the whole array (large arrays of large
# models keep the parallel write). Measured in benchmarks/NOTES.md.
REPLICA_PARALLEL_MIN_SLICE_BYTES = 4 << 20
RETRIES = 5  # how often restore_newest starts over when the step it reads is rotated out meanwhile
REMOVAL_WAIT_S = 2.0  # how long a failed read waits to see a half-removed, rotated-out step disappear
DATA_STATE_MAX = 2**53  # a data position above this (9e15 examples) is damage, not progress
PACKAGES = ("jepa-cli", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "tensorstore", "numpy")


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


@functools.cache
def _register_array_handler() -> None:
    """jax.Array's orbax handler with REPLICA_PARALLEL_MIN_SLICE_BYTES, else as orbax registers it
    (with its per-array metadata store, which writes state/array_metadatas). Once per process, so a
    handler is never swapped under a save in flight. Orbax logs the override as an absl warning
    ("Type handler registry type ... overriding"), which would precede every error of the first
    load and show in a notebook: that record alone is dropped, while the override runs."""
    import logging

    import orbax.checkpoint as ocp

    class _OwnOverride(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not str(record.msg).startswith("Type handler registry type")

    store = getattr(ocp.type_handlers.get_type_handler(jax.Array), "_array_metadata_store", None)
    handler = ocp.type_handlers.ArrayHandler(min_slice_bytes_for_replica_parallel=REPLICA_PARALLEL_MIN_SLICE_BYTES,
                                             array_metadata_store=store)
    absl_logger, quiet = logging.getLogger("absl"), _OwnOverride()
    absl_logger.addFilter(quiet)
    try:
        ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)
    finally:
        absl_logger.removeFilter(quiet)


class UnreadableCheckpoint(InputError):
    """A complete checkpoint whose files no longer read back (exit code 2); `step` names it."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


class CheckpointRemoved(InputError):
    """A checkpoint that disappeared while it was read (exit code 2): rotated out by a trainer that keeps
    fewer checkpoints, not damaged; `step` names it."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


def _check_data_state(data: Any) -> dict[str, Any]:
    """The restored data iterator state, once it is a JSON object of counts (grain's iterator keeps its
    position as one); anything else, e.g. a position of 10^30, is a damaged checkpoint."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ValueError(f"the data state is a {type(data).__name__}, not a JSON object")
    for key, value in data.items():
        if type(value) is not int or not 0 <= value < DATA_STATE_MAX:
            raise ValueError(f"the data state has {key} = {str(value)[:40]}, not a count below 2^53")
    return data


class Checkpoints:
    """A thin CheckpointManager: save(step, state_dict, data_state, config), restore(step, target).

    Each save is followed, once the step is committed, by its digest (write_digest): at once for a
    synchronous save, by a thread that waits for the commit for an asynchronous one. The digest of a
    step is written holding a lock that save() also takes, and only while orbax still lists the step,
    so that a step rotated out by the next save is never written into while it is deleted."""

    def __init__(self, run_dir: str | Path, keep: int | None = None, async_save: bool = True, create: bool = True):
        import orbax.checkpoint as ocp

        self._ocp = ocp
        _register_array_handler()
        self.directory = (Path(run_dir) / "checkpoints").resolve()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep or None, create=create,
                                               enable_async_checkpointing=async_save)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)
        self._async = async_save
        self._digest_lock = threading.Lock()
        self._digesters: list[threading.Thread] = []

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: dict[str, Any], data_state: dict[str, Any] | None, config: dict[str, Any]) -> bool:
        ocp = self._ocp
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(data_state or {}),
            config=ocp.args.JsonSave(config),
            versions=ocp.args.JsonSave(package_versions()),
        )
        with self._digest_lock:
            saved = self.manager.save(int(step), args=args, force=True)
        if saved and jax.process_index() == 0:
            if self._async:
                self._digesters = [t for t in self._digesters if t.is_alive()]
                thread = threading.Thread(target=self._digest_when_committed, args=(int(step),),
                                          name=f"jepa-digest-{step}", daemon=True)
                thread.start()
                self._digesters.append(thread)
            else:
                self._write_digest(int(step))
        return saved

    def _write_digest(self, step: int) -> None:
        """The digest of a committed step. A file system that refuses it (full, read-only) leaves the step
        without one, restored unchecked: the checkpoint itself is whole, and the next save meets the
        same refusal and reports it."""
        with self._digest_lock:
            if step in self.manager.all_steps():
                try:
                    write_digest(self.directory / str(step))
                except OSError:
                    pass

    def _digest_when_committed(self, step: int) -> None:
        try:
            self.manager.wait_until_finished()
            self._write_digest(step)
        except Exception:  # noqa: BLE001 - a failed save is the trainer's to report (its next save or wait);
            pass  # the step then simply has no digest

    def restore(self, step: int, target: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """Restores onto `target` (ShapeDtypeStructs with the wanted shardings): any mesh works.
        `target` may also be a function of the step's own saved config (a dict) that returns them.

        A checkpoint whose tree or shapes differ from `target` (another model) is an InputError; one
        whose files are damaged (or do not match its digest) is an UnreadableCheckpoint; one that
        disappears meanwhile is a CheckpointRemoved."""
        try:
            return self._restore(int(step), target)
        except (UnreadableCheckpoint, FileNotFoundError) as exc:
            if self._removed(int(step)):
                raise CheckpointRemoved(f"{self.directory.parent}: its checkpoint at step {step} was removed while "
                                        "it was read (a trainer keeping fewer checkpoints rotated it out)",
                                        int(step)) from None
            if isinstance(exc, FileNotFoundError):
                raise self._unreadable(step, exc) from None
            raise

    def _newest_on_disk(self) -> int | None:
        """The newest committed step in the directory now (orbax's listing is read once, at start)."""
        steps = ([int(p.name) for p in self.directory.iterdir() if is_step_name(p.name) and p.is_dir()]
                 if self.directory.is_dir() else [])
        return max(steps, default=None)

    def _removed(self, step: int) -> bool:
        """Whether `step` is gone or going after a read of it failed: its directory is gone, or a newer
        step exists and the directory disappears within REMOVAL_WAIT_S. Orbax removes a rotated-out
        step after committing the newer one, file by file, so a read can fail on a directory that
        still exists, half emptied."""
        path = self.directory / str(step)
        deadline = time.monotonic() + REMOVAL_WAIT_S
        while path.is_dir():
            newest = self._newest_on_disk()
            if newest is None or newest <= step or time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _restore(self, step: int, target: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        ocp = self._ocp
        problem = digest_problem(self.directory / str(step))
        if problem is not None:
            raise UnreadableCheckpoint(f"{self.directory.parent}: checkpoint at step {step} is unreadable, its files "
                                       f"changed since it was saved ({self.directory / str(step)}: {problem})", step)
        if callable(target):
            try:
                config = self.restore_json(step, "config")
            except Exception as exc:  # noqa: BLE001 - a damaged or missing config item
                raise self._unreadable(step, exc) from None
            try:
                target = target(config)
            except InputError:
                raise
            except Exception as exc:  # noqa: BLE001 - options an objective's factory or the optimizer cannot take
                reason = " ".join(str(exc).split())[:160]
                raise InputError(f"{self.directory.parent}: the configuration saved with its checkpoint at step {step} "
                                 f"does not build a model ({type(exc).__name__}: {reason})") from None
        self._precheck(step, target)
        args = ocp.args.Composite(state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore(),
                                  config=ocp.args.JsonRestore())
        try:
            out = self.manager.restore(step, args=args)
            data = _check_data_state(out["data"])
        except Exception as exc:  # noqa: BLE001 - the tree matched (_precheck): TensorStore, JSON or orbax
            raise self._unreadable(step, exc) from None  # errors here mean damaged files, whatever their type
        _check_shapes(out["state"], target, self.directory.parent, step)
        return out["state"], data, dict(out["config"] or {})

    def newest_intact(self, exclude: int) -> int | None:
        """The newest step other than `exclude` whose files match its digest (or that has none), for
        naming what to use instead of a damaged step; None when there is none."""
        for step in reversed(self.steps()):
            try:
                if step != exclude and digest_problem(self.directory / str(step)) is None:
                    return step
            except FileNotFoundError:
                continue
        return None

    def restore_newest(self, target: Any, on_fallback: Callable[[int, str], None] | None = None
                       ) -> tuple[int, dict[str, Any], dict[str, Any], dict[str, Any]]:
        """(step, state, data, config) of the newest checkpoint that reads back. Each newer, unreadable
        one is reported as on_fallback(step, message); another model's checkpoint is an InputError at
        once (every checkpoint of a run holds the same model, so an older one would not help)."""
        previous: list[int] | None = None
        for _ in range(RETRIES + 1):
            steps = self.steps()
            if not steps:
                raise InputError(f"{self.directory.parent}: holds no checkpoint yet")
            # a newer directory that listing again did not bring in is no step a trainer saved
            listing_changed, previous = steps != previous, steps
            skipped: list[UnreadableCheckpoint] = []
            for step in reversed(steps):
                try:
                    restored = self.restore(step, target)
                except CheckpointRemoved:
                    break  # rotated out while read: list again, the trainer saved a newer one
                except UnreadableCheckpoint as exc:
                    if listing_changed and (self._newest_on_disk() or -1) > steps[-1]:
                        break  # the trainer saved a newer step meanwhile (and may be removing this one): list again
                    skipped.append(exc)
                    continue
                for exc in skipped:
                    if on_fallback is not None:
                        on_fallback(exc.step, f"{exc}; using step {step}, the newest intact checkpoint")
                return (step, *restored)
            else:
                raise UnreadableCheckpoint(f"{self.directory.parent}: no checkpoint reads back (steps "
                                           f"{', '.join(map(str, steps))}); the newest: {skipped[0]}", steps[-1])
            self.manager.reload()
        raise InputError(f"{self.directory.parent}: each of its newest checkpoints was removed while it was read, "
                         f"{RETRIES + 1} times (a trainer keeping fewer checkpoints rotates them out faster than they "
                         "can be read; read a run that is not training, or train with a larger --keep)")

    def set_aside(self, step: int) -> Path:
        """Moves a damaged checkpoint out of the way (RUN/unreadable-checkpoints/<step>, never deleted),
        so that training can save that step again; returns where it went."""
        aside = self.directory.parent / UNREADABLE_DIR
        aside.mkdir(exist_ok=True)
        target, n = aside / str(step), 1
        while target.exists():
            target, n = aside / f"{step}.{n}", n + 1
        (self.directory / str(step)).rename(target)
        self.manager.reload()
        return target

    def _unreadable(self, step: int, exc: BaseException) -> UnreadableCheckpoint:
        settle_abandoned_reads_at_exit()
        # TensorStore errors end with a multi-line spec dump: keep the first sentence.
        reason = " ".join(str(exc).split("See full TensorStore details")[0].split())[:160] or type(exc).__name__
        return UnreadableCheckpoint(f"{self.directory.parent}: checkpoint at step {step} is unreadable, its files "
                                    f"are truncated or corrupt ({self.directory / str(step)}: {reason})", int(step))

    def _precheck(self, step: int, target: Any) -> None:
        """Compares the stored tree (paths and shapes) with the target's before reading any array."""
        from etils import epath

        silence_abandoned_reads()  # before the first read: a stray traceback can come at once
        try:
            meta = self._ocp.StandardCheckpointHandler().metadata(epath.Path(self.directory / str(step) / "state"))
        except Exception as exc:  # noqa: BLE001 - _METADATA is damaged or missing
            raise self._unreadable(step, exc) from None
        meta = getattr(meta, "item_metadata", meta)
        for roots, what in ((("params", "ema"), "another model"), (None, "another optimizer state")):
            stored, wanted = _shapes(meta, roots), _shapes(target, roots)
            if stored.keys() != wanted.keys():
                diff = sorted(stored.keys() ^ wanted.keys())
                raise InputError(f"{self.directory.parent}: its checkpoint at step {step} holds {what} "
                                 f"(entry {diff[0]} is in only one of them)")
            for key, shape in wanted.items():
                if stored[key] != shape:
                    raise InputError(f"{self.directory.parent}: its checkpoint at step {step} holds {what} "
                                     f"({key}: stored {stored[key]}, this model {shape})")

    def restore_json(self, step: int, item: str) -> dict[str, Any]:
        ocp = self._ocp
        return dict(self.manager.restore(int(step), args=ocp.args.Composite(**{item: ocp.args.JsonRestore()}))[item])

    def wait(self) -> None:
        """Waits for the save in flight and the digests of every saved step."""
        self.manager.wait_until_finished()
        for thread in self._digesters:
            thread.join()
        self._digesters = []

    def close(self) -> None:
        self.wait()
        self.manager.close()


def _shapes(tree: Any, roots: tuple[str, ...] | None) -> dict[str, tuple[int, ...]]:
    """{'params/encoder/kernel': shape, ...} for the leaves under `roots` (None: every leaf)."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        names = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
        if names and (roots is None or names[0] in roots) and hasattr(leaf, "shape"):
            out["/".join(names)] = tuple(leaf.shape)
    return out


def _check_shapes(restored: Any, target: Any, run_dir: Path, step: int) -> None:
    got = jax.tree_util.tree_flatten_with_path(restored)[0]
    want = jax.tree_util.tree_flatten_with_path(target)[0]
    if len(got) != len(want):
        raise InputError(f"{run_dir}: its checkpoint at step {step} holds another model ({len(got)} arrays, "
                         f"this model has {len(want)})")
    for (path, a), (_, b) in zip(got, want):
        if tuple(a.shape) != tuple(b.shape):
            raise InputError(f"{run_dir}: its checkpoint at step {step} holds another model "
                             f"({jax.tree_util.keystr(path)}: {tuple(a.shape)} vs {tuple(b.shape)})")
