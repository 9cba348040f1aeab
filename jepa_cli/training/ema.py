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
    damaged newer one is reported as on_fallback(step, message), see run.load_run): the momentum
    schedule, each module's distance between the online and EMA weights, and `init_weight`, the
    weight the EMA's initial value still holds (kept_weight over the updates done)."""
    import jax

    from jepa_cli.training.run import load_run
    from jepa_cli.training.runfiles import read_run

    config, objective, host, ckpt_step = load_run(run_dir, step, on_fallback)
    spec = objective.ema_spec
    if spec is None:
        raise InputError(f"{run_dir}: the {config.get('objective')!r} objective keeps no EMA (its one encoder is "
                         "what encode-latents and the probes read)")
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
        # the weight the EMA's initial value (a target encoder's random initialisation) keeps at this step
        "init_weight": kept_weight(spec.momentum, ckpt_step),
        "modules": modules,
        "schedule": schedule,
    }
    if at is not None:
        out["at"] = {"step": int(at), "momentum": float(momentum(int(at)))}
    return out


KEPT_WARNING = 0.5  # a target encoder that keeps more of its initialisation than this hardly learned
KEPT_SUGGESTED = 0.1  # what the suggested START brings the weight kept to, at most


def kept_weight(momentum: Callable[[Any], Any], steps: int, stop_below: float = 0.0) -> float:
    """prod_{t < steps} momentum(t): the weight the EMA's initial value keeps in it after `steps`
    updates (each sets ema = m ema + (1 - m) params). Summed as logs in float64 of the float32 momenta
    the updates use, in chunks; it stops once the product is under `stop_below` (then it returns a
    value under it, not the exact product)."""
    import jax.numpy as jnp

    log_kept, chunk = 0.0, 1 << 16
    for start in range(0, steps, chunk):
        m = np.asarray(momentum(jnp.arange(start, min(steps, start + chunk))), np.float64)
        if np.any(m <= 0):
            return 0.0
        log_kept += float(np.sum(np.log(m)))
        if stop_below > 0 and log_kept < math.log(stop_below):
            break
    return math.exp(log_kept)


def ema_warning(objective: Any, steps: int) -> str | None:
    """The warning for a run whose target encoder cannot move far from its random initialisation: the
    EMA momenta the run will use (the objective's EMASpec over its `steps` updates) leave it more than
    KEPT_WARNING of its initial value (kept_weight), as a 100-update run of a ramp from 0.996 does. It
    suggests an `--ema START,END` of the same END whose START (a multiple of 0.001) brings the weight
    kept to KEPT_SUGGESTED or less. None for a run that moves it, one of no update, and an objective
    whose EMA is not a target encoder with an `ema` range."""
    spec = getattr(objective, "ema_spec", None)
    config = getattr(objective, "config", None)
    if steps <= 0 or spec is None or spec.source is None or not hasattr(config, "ema"):
        return None
    kept = kept_weight(spec.momentum, steps)
    if kept <= KEPT_WARNING:
        return None
    import dataclasses

    start, end = config.ema

    def kept_from(start_: float) -> float:
        other = type(objective)(dataclasses.replace(config, ema=(start_, end)))
        return kept_weight(other.ema_spec.momentum, steps, stop_below=KEPT_SUGGESTED / 2)

    suggested = math.floor(min(start, end) * 1000)
    lo, hi = 0, suggested  # in thousandths: START lo keeps KEPT_SUGGESTED or less, START hi more
    if kept_from(0.0) > KEPT_SUGGESTED:
        suggestion = "train longer"
    else:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if kept_from(mid / 1000) <= KEPT_SUGGESTED else (lo, mid)
        suggestion = f"set --ema {lo / 1000:g},{end:g} (or train longer)"
    return (f"the target encoder keeps {kept:.2f} of its random initialisation over the run's {steps} updates "
            f"(EMA momentum {start:g} -> {end:g}): it will probe much like an untrained encoder; {suggestion}")
