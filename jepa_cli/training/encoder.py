"""Which parameters of a run are its encoder: the EMA target or the context encoder, as every command
that encodes with a run (encode-latents, the probes, fd, export, the trainer's own probes) chooses."""

from __future__ import annotations

from typing import Any

from jepa_cli.errors import InputError

WEIGHTS = ("target", "context")


def select_encoder(objective, host: dict[str, Any], weights: str, run_dir) -> Any:
    """The encoder parameters: the EMA target (`ema`) or the context encoder (`params['encoder']`). An
    objective without an EMA spec (LeJEPA) has one encoder, `params['encoder']`, which both name."""
    if weights not in WEIGHTS:
        raise InputError(f"--weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    name = getattr(objective, "name", type(objective).__name__)
    if not callable(getattr(objective, "encode", None)):
        raise InputError(f"{run_dir}: objective {name!r} has no encoder to encode with")
    params = host.get("params") or {}
    one_encoder = hasattr(objective, "ema_spec") and objective.ema_spec is None
    if weights == "target" and not one_encoder:
        if host.get("ema") is None:
            raise InputError(f"{run_dir}: objective {name!r} keeps no target (EMA) encoder; use --weights context")
        return host["ema"]
    if not isinstance(params, dict) or "encoder" not in params:
        raise InputError(f"{run_dir}: objective {name!r} has no 'encoder' parameters")
    return params["encoder"]
