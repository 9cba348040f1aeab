"""A published I-JEPA checkpoint (facebookresearch/ijepa, `torch.save` of a dict with `encoder`,
`predictor`, `target_encoder`, `opt`, `epoch`, ...) -> a run directory like the ones `jepa train`
writes, so `encode-latents`, `probe`, `ema-inspect` and `train --resume` read it like any other run.

What is imported: the context encoder and the predictor as the run's params, the target encoder as
its EMA, the step `epoch x ipe` (the official checkpoints store epochs; `ipe` is the iterations per
epoch of the official run, 625 for in1k_vith14: 1,281,167 images // batch 2048). What is not: the
optimizer's moments (AdamW starts from zero on `--resume`) and the data position (a resumed run
starts its data from the beginning). run.json records the source file's name and SHA-256; the
checkpoint's digest (training/checkpoint.py) is checked against its files before the run is moved
into place.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from jepa_cli.errors import InputError

IN1K_IPE = 625  # in1k_vith14_ep300.yaml: 1,281,167 images // (16 GPUs x batch 128)
IN1K_EPOCHS = 300  # in1k_vith14_ep300.yaml: optimization.epochs
MAX_STEP = 2**31 - 1  # TrainState.step is int32


@dataclasses.dataclass(frozen=True)
class ImportOptions:
    """The model the checkpoint holds (as `jepa train --objective ijepa` options) and the official
    run's length (for the step and the schedules of a resumed run)."""

    objective_config: dict[str, Any]  # model, patch_size, image_size, pred_depth, pred_width, ...
    ipe: int = IN1K_IPE
    epochs: int = IN1K_EPOCHS
    batch_size: int = 2048  # in1k_vith14: 16 GPUs x 128
    seed: int = 0


def official_parts(checkpoint: Any, source: Path) -> dict[str, Mapping[str, np.ndarray]]:
    """{'encoder', 'predictor', 'target_encoder'} state dicts of a loaded official checkpoint; an
    InputError naming the tensor for one that holds NaN or inf (a diverged run's weights)."""
    if not isinstance(checkpoint, Mapping):
        raise InputError(f"{source}: holds a {type(checkpoint).__name__}, not the dict of an I-JEPA checkpoint")
    missing = [k for k in ("encoder", "predictor", "target_encoder") if k not in checkpoint]
    if missing:
        raise InputError(f"{source}: not an I-JEPA checkpoint (no {', '.join(missing)}; it has "
                         f"{', '.join(sorted(map(str, checkpoint))) or 'nothing'})")
    parts = {}
    for key in ("encoder", "predictor", "target_encoder"):
        part = checkpoint[key]
        if not (isinstance(part, Mapping) and all(isinstance(k, str) and isinstance(v, np.ndarray)
                                                  for k, v in part.items())):
            raise InputError(f"{source}: {key} is not a state dict of tensors (names to tensors)")
        parts[key] = part
    from jepa_cli.models.vit import first_non_finite

    for key, part in parts.items():
        found = first_non_finite(part)
        if found is not None:
            path, bad, size = found
            raise InputError(f"{source}: {key} tensor {path[0].key} holds {bad} non-finite value(s) (NaN or inf) "
                             f"of {size}; a run needs finite weights")
    return parts


def _check_shapes(ours: Any, want: Any, source: Path, what: str) -> None:
    import jax

    have = {jax.tree_util.keystr(p): np.shape(v) for p, v in jax.tree_util.tree_flatten_with_path(ours)[0]}
    need = {jax.tree_util.keystr(p): tuple(v.shape) for p, v in jax.tree_util.tree_flatten_with_path(want)[0]}
    for name in sorted(need):
        if name not in have:
            raise InputError(f"{source}: the {what} lacks {name} that the chosen model has (another model size "
                             "or depth? check --model, --patch-size and the predictor options)")
        if have[name] != need[name]:
            raise InputError(f"{source}: the {what}'s {name} is {list(have[name])}, the chosen model's is "
                             f"{list(need[name])} (check --model, --patch-size and the predictor options)")
    extra = sorted(set(have) - set(need))
    if extra:
        raise InputError(f"{source}: the {what} has {extra[0]} that the chosen model lacks (a deeper model? "
                         "check --model and the predictor options)")


def _check_written(step_dir: Path, out: str | Path) -> None:
    """The checkpoint just written has its digest and its files match it (a disk that lost or changed
    bytes on the way is caught before the run is moved into place)."""
    from jepa_cli.errors import JepaError
    from jepa_cli.training.checkpoint import DIGEST_FILE, digest_problem

    problem = digest_problem(step_dir) if (step_dir / DIGEST_FILE).is_file() else f"no {DIGEST_FILE} was written"
    if problem is not None:
        raise JepaError(f"{out}: the imported checkpoint does not read back as written ({problem}); nothing written")


def import_ijepa(source: str | Path, out: str | Path, options: ImportOptions,
                 log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Writes RUN `out` (atomically: all of it or nothing) from the official checkpoint `source`.
    Returns a summary: the run, its step, the epoch, the source's SHA-256, parameter counts."""
    import jax

    from jepa_cli.data.atomic import atomic_directory
    from jepa_cli.models.convert import from_official
    from jepa_cli.models.torch_checkpoint import read_torch_checkpoint
    from jepa_cli.training.checkpoint import Checkpoints, sha256_of
    from jepa_cli.training.config import build_config, resolve_lengths
    from jepa_cli.training.run import build_optimizer, make_objective, objective_config_of, write_run
    from jepa_cli.training.state import TrainState

    source = Path(source)
    checkpoint = read_torch_checkpoint(source)
    parts = official_parts(checkpoint, source)
    epoch = checkpoint.get("epoch", 0)
    if type(epoch) is not int or epoch < 0:  # a bool is an int to Python, not a count
        raise InputError(f"{source}: its epoch is {str(epoch)[:40]}, not a count of epochs")
    if epoch * options.ipe > MAX_STEP:
        raise InputError(f"{source}: its epoch {str(epoch)[:40]} x --ipe {options.ipe} is past the last step a run "
                         f"can hold ({MAX_STEP:,}, the int32 step counter)")

    cfg = build_config({"objective": "ijepa", "epochs": float(options.epochs), "batch_size": options.batch_size,
                        "seed": options.seed, "out": str(out), "data": None})
    lengths = resolve_lengths(cfg, options.ipe * options.batch_size)
    objective = make_objective("ijepa", dict(options.objective_config), lengths["ema_t_max"])
    cfg.objective_config = objective_config_of(objective, options.objective_config)

    params = {"encoder": from_official(parts["encoder"]),
              "predictor": from_official(parts["predictor"], predictor=True)}
    target = from_official(parts["target_encoder"])
    want = objective.param_shapes()
    _check_shapes(params["encoder"], want["encoder"], source, "encoder")
    _check_shapes(params["predictor"], want["predictor"], source, "predictor")
    _check_shapes(target, want["encoder"], source, "target encoder")
    params = jax.tree.map(lambda v, w: np.asarray(v, w.dtype), params, want)
    target = jax.tree.map(lambda v, w: np.asarray(v, w.dtype), target, want["encoder"])

    step = epoch * options.ipe
    tx, *_ = build_optimizer(cfg, objective, lengths, want)
    init_key, rng = jax.random.split(jax.random.PRNGKey(options.seed))  # as state.init_state splits
    del init_key
    state = TrainState(params=params, ema=target, opt_state=tx.init(params),
                       step=np.asarray(step, np.int32), rng=np.asarray(rng))
    digest = sha256_of(source)
    record = {"jepa_kind": "run", "config": cfg.to_dict(), "lengths": lengths, "dataset": None,
              "status": "imported",
              "imported": {"source": source.name, "sha256": digest, "epoch": epoch, "ipe": options.ipe,
                           "format": "facebookresearch/ijepa checkpoint (torch.save)"}}
    with atomic_directory(out, force=False, kind="run", inputs=[source], log=log) as tmp:
        record["config"]["out"] = str(out)
        ckpts = Checkpoints(tmp, keep=None, async_save=False)
        try:
            ckpts.save(step, state.as_dict(), {}, {**record["config"], "lengths": lengths})
            ckpts.wait()
        finally:
            ckpts.close()
        _check_written(tmp / "checkpoints" / str(step), out)
        write_run(tmp, record)
    count = lambda tree: int(sum(np.size(v) for v in jax.tree.leaves(tree)))  # noqa: E731
    return {"run": str(out), "step": step, "epoch": epoch, "source": str(source), "sha256": digest,
            "encoder_params": count(params["encoder"]), "predictor_params": count(params["predictor"])}
