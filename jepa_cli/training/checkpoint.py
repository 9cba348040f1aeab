"""Orbax checkpoints under RUN/checkpoints/<step>/: state, data iterator state, resolved config,
package versions. Orbax writes each step to a temporary directory and renames it when complete, so
a half-written checkpoint is never listed, hence never restored. A complete checkpoint whose files
were damaged later (truncated, overwritten) is an UnreadableCheckpoint naming its step; readers that
want "the latest" fall back to the newest one that reads back (restore_newest)."""

from __future__ import annotations

import functools
import importlib.metadata
from pathlib import Path
from typing import Any, Callable

import jax

from jepa_cli.errors import InputError

ITEMS = ("state", "data", "config", "versions")
UNREADABLE_DIR = "unreadable-checkpoints"  # RUN/<this>/<step>: where a resume moves damaged checkpoints
# Orbax splits each replicated array across its replicas to write it in parallel; every split is an
# eager slice, compiled once per shape (36 compiles, about 1.8 s, on a 2-block model with 4 replicas
# on CPU). Below this many bytes per slice one replica writes the whole array (large arrays of large
# models keep the parallel write). Measured in benchmarks/NOTES.md.
REPLICA_PARALLEL_MIN_SLICE_BYTES = 4 << 20
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
    handler is never swapped under a save in flight."""
    import orbax.checkpoint as ocp

    store = getattr(ocp.type_handlers.get_type_handler(jax.Array), "_array_metadata_store", None)
    handler = ocp.type_handlers.ArrayHandler(min_slice_bytes_for_replica_parallel=REPLICA_PARALLEL_MIN_SLICE_BYTES,
                                             array_metadata_store=store)
    ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)


class UnreadableCheckpoint(InputError):
    """A complete checkpoint whose files no longer read back (exit code 2); `step` names it."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


class Checkpoints:
    """A thin CheckpointManager: save(step, state_dict, data_state, config), restore(step, target)."""

    def __init__(self, run_dir: str | Path, keep: int | None = None, async_save: bool = True, create: bool = True):
        import orbax.checkpoint as ocp

        self._ocp = ocp
        _register_array_handler()
        self.directory = (Path(run_dir) / "checkpoints").resolve()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep or None, create=create,
                                               enable_async_checkpointing=async_save)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

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
        return self.manager.save(int(step), args=args, force=True)

    def restore(self, step: int, target: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """Restores onto `target` (ShapeDtypeStructs with the wanted shardings): any mesh works.

        A checkpoint whose tree or shapes differ from `target` (another model) is an InputError; one
        whose files are damaged is an UnreadableCheckpoint."""
        ocp = self._ocp
        self._precheck(step, target)
        args = ocp.args.Composite(state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore(),
                                  config=ocp.args.JsonRestore())
        try:
            out = self.manager.restore(int(step), args=args)
        except Exception as exc:  # noqa: BLE001 - the tree matched (_precheck): TensorStore, JSON or orbax
            raise self._unreadable(step, exc) from None  # errors here mean damaged files, whatever their type
        _check_shapes(out["state"], target, self.directory.parent, step)
        return out["state"], dict(out["data"] or {}), dict(out["config"] or {})

    def restore_newest(self, target: Any, on_fallback: Callable[[int, str], None] | None = None
                       ) -> tuple[int, dict[str, Any], dict[str, Any], dict[str, Any]]:
        """(step, state, data, config) of the newest checkpoint that reads back. Each newer, unreadable
        one is reported as on_fallback(step, message); another model's checkpoint is an InputError at
        once (every checkpoint of a run holds the same model, so an older one would not help)."""
        steps = self.steps()
        if not steps:
            raise InputError(f"{self.directory.parent}: holds no checkpoint yet")
        skipped: list[UnreadableCheckpoint] = []
        for step in reversed(steps):
            try:
                restored = self.restore(step, target)
            except UnreadableCheckpoint as exc:
                skipped.append(exc)
                continue
            for exc in skipped:
                if on_fallback is not None:
                    on_fallback(exc.step, f"{exc}; using step {step}, the newest intact checkpoint")
            return (step, *restored)
        raise UnreadableCheckpoint(f"{self.directory.parent}: no checkpoint reads back (steps "
                                   f"{', '.join(map(str, steps))}); the newest: {skipped[0]}", steps[-1])

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
        _settle_abandoned_reads_at_exit()
        # TensorStore errors end with a multi-line spec dump: keep the first sentence.
        reason = " ".join(str(exc).split("See full TensorStore details")[0].split())[:160] or type(exc).__name__
        return UnreadableCheckpoint(f"{self.directory.parent}: checkpoint at step {step} is unreadable, its files "
                                    f"are truncated or corrupt ({self.directory / str(step)}: {reason})", int(step))

    def _precheck(self, step: int, target: Any) -> None:
        """Compares the stored tree (paths and shapes) with the target's before reading any array."""
        from etils import epath

        _silence_abandoned_reads()  # before the first read: a stray traceback can come at once
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
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


_silenced = False
_settling = False


def _silence_abandoned_reads() -> None:
    """When one read of a damaged checkpoint fails, orbax leaves its other reads in flight; when
    they fail too, or complete after orbax closed their event loop, Python prints their tracebacks
    on stderr (asyncio's log, the unraisable hook, the except hook) around the command's one error
    line. The failure is reported once, as an UnreadableCheckpoint: drop exactly those tracebacks
    (errors raised in orbax's code, and "Event loop is closed") for the rest of the process. Installed
    before the first read, since a stray traceback can come from another thread at once."""
    import logging
    import sys

    global _silenced
    if _silenced:
        return
    _silenced = True

    def from_orbax(tb) -> bool:
        while tb is not None:
            if "orbax" in tb.tb_frame.f_code.co_filename:
                return True
            tb = tb.tb_next
        return False

    def loop_closed(exc) -> bool:
        return isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"

    def stray(exc) -> bool:
        # A read's error may carry no orbax frame (an awaited TensorStore future): its text names TensorStore.
        return exc is not None and (from_orbax(exc.__traceback__) or loop_closed(exc)
                                    or "tensorstore" in str(exc).lower())

    class _Filter(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not stray(record.exc_info[1] if record.exc_info else None)

    logging.getLogger("asyncio").addFilter(_Filter())
    unraisable, excepthook = sys.unraisablehook, sys.excepthook

    def on_unraisable(info) -> None:
        code = getattr(info.object, "cr_code", None)
        if not ((code is not None and "orbax" in code.co_filename) or stray(info.exc_value)):
            unraisable(info)

    def on_exception(kind, value, tb) -> None:
        if not (stray(value) or from_orbax(tb)):
            excepthook(kind, value, tb)

    sys.unraisablehook, sys.excepthook = on_unraisable, on_exception


def _settle_abandoned_reads_at_exit() -> None:
    """After a failed read, gives the stray reads a moment at exit to end while the filters above
    still work (during the interpreter's shutdown Python prints with its default hooks)."""
    import atexit
    import time

    global _settling
    if not _settling:
        _settling = True
        atexit.register(time.sleep, 0.5)  # local reads end within milliseconds


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
