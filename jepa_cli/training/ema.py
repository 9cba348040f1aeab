"""`jepa ema-inspect`: the EMA momentum schedule of a run and how far the EMA is from the online
parameters, per top-level module of the averaged subtree. Works for any objective's EMASpec."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jepa_cli.errors import InputError


def ema_report(run_dir: str | Path, at: int | None = None, step: int | None = None, points: int = 64,
               on_fallback: Callable[[int, str], None] | None = None) -> dict[str, Any]:
    """The report of `jepa ema-inspect` for checkpoint `step` (None: the newest that reads back; a
    damaged newer one is reported as on_fallback(step, message), see run.load_run)."""
    import jax

    from jepa_cli.training.run import load_run, read_run

    config, objective, host, ckpt_step = load_run(run_dir, step, on_fallback)
    spec = objective.ema_spec
    if spec is None:
        raise InputError(f"{run_dir}: the {config.get('objective')!r} objective keeps no EMA")
    lengths = read_run(run_dir).get("lengths", {})
    # the schedule is drawn to the end of the longer of the LR horizon and the EMA ramp, which
    # ema_ramp_steps / ema_ramp_epochs may set apart from it: the whole ramp shows
    total = int(lengths.get("t_max") or lengths.get("steps") or max(ckpt_step, 1))
    total = max(total, math.ceil(float(lengths.get("ema_t_max") or 0)))
    if at is not None and at < 0:
        raise InputError(f"--at must be >= 0, got {at}")
    momentum = jax.jit(spec.momentum)
    xs = np.unique(np.linspace(0, total, num=min(points, total + 1)).round().astype(int))
    schedule = [{"step": int(s), "momentum": float(momentum(int(s)))} for s in xs]
    online = host["params"] if spec.source is None else host["params"][spec.source]
    ema = host["ema"]
    modules = []
    names = sorted(online) if isinstance(online, dict) else [None]
    for name in names:
        a = online[name] if name is not None else online
        b = ema[name] if name is not None else ema
        va = np.concatenate([np.ravel(x).astype(np.float64) for x in jax.tree.leaves(a)] or [np.zeros(0)])
        vb = np.concatenate([np.ravel(x).astype(np.float64) for x in jax.tree.leaves(b)] or [np.zeros(0)])
        nb = float(np.linalg.norm(vb))
        na = float(np.linalg.norm(va))
        modules.append({
            "name": name if name is not None else (spec.source or "params"),
            "params": int(va.size),
            "relative_distance": float(np.linalg.norm(va - vb) / nb) if nb > 0 else (0.0 if na == 0 else float("inf")),
            "cosine": float(va @ vb / (na * nb)) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0),
        })
    out: dict[str, Any] = {
        "run": str(run_dir),
        "source": spec.source,
        "step": ckpt_step,
        "momentum": float(momentum(ckpt_step)),
        "total_steps": total,
        "modules": modules,
        "schedule": schedule,
    }
    if at is not None:
        out["at"] = {"step": int(at), "momentum": float(momentum(int(at)))}
    return out
