"""Orbax checkpoints under RUN/checkpoints/<step>/: state, data iterator state, resolved config,
package versions. Orbax writes each step to a temporary directory and renames it when complete, so
a half-written checkpoint is never listed, hence never restored."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import jax

from jepa_cli.errors import InputError

ITEMS = ("state", "data", "config", "versions")
PACKAGES = ("jepa-cli", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "tensorstore", "numpy")


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


class Checkpoints:
    """A thin CheckpointManager: save(step, state_dict, data_state, config), restore(step, target)."""

    def __init__(self, run_dir: str | Path, keep: int | None = None, async_save: bool = True, create: bool = True):
        import orbax.checkpoint as ocp

        self._ocp = ocp
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

        A checkpoint whose tree or shapes differ from `target` (another model) is an InputError."""
        ocp = self._ocp
        self._precheck(step, target)
        args = ocp.args.Composite(state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore(),
                                  config=ocp.args.JsonRestore())
        try:
            out = self.manager.restore(int(step), args=args)
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{self.directory.parent}: its checkpoint at step {step} does not match this "
                             f"model ({' '.join(str(exc).split())[:200]})") from None
        _check_shapes(out["state"], target, self.directory.parent, step)
        return out["state"], dict(out["data"] or {}), dict(out["config"] or {})

    def _precheck(self, step: int, target: Any) -> None:
        """Compares the stored params/EMA shapes with the target's before reading any array."""
        from etils import epath

        try:
            meta = self._ocp.StandardCheckpointHandler().metadata(epath.Path(self.directory / str(step) / "state"))
        except Exception:  # noqa: BLE001 - no readable metadata: let the restore itself decide
            return
        meta = getattr(meta, "item_metadata", meta)
        stored = _shapes(meta, ("params", "ema"))
        wanted = _shapes(target, ("params", "ema"))
        if stored.keys() != wanted.keys():
            diff = sorted(stored.keys() ^ wanted.keys())
            raise InputError(f"{self.directory.parent}: its checkpoint at step {step} holds another model "
                             f"(parameter {diff[0]} is in only one of them)")
        for key, shape in wanted.items():
            if stored[key] != shape:
                raise InputError(f"{self.directory.parent}: its checkpoint at step {step} holds another model "
                                 f"({key}: stored {stored[key]}, this model {shape})")

    def restore_json(self, step: int, item: str) -> dict[str, Any]:
        ocp = self._ocp
        return dict(self.manager.restore(int(step), args=ocp.args.Composite(**{item: ocp.args.JsonRestore()}))[item])

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def _shapes(tree: Any, roots: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        names = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
        if names and names[0] in roots and hasattr(leaf, "shape"):
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
