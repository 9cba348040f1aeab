"""A mask config from keyword options given as values or command-line text ('0.15,0.2')."""

from __future__ import annotations

import dataclasses
from typing import Any

from jepa_cli.errors import InputError
from jepa_cli.masks.config import CONFIGS, MaskConfig
from jepa_cli.masks.checks import validate

def config_from_options(strategy: str, **options: Any) -> MaskConfig:
    """A validated config for `strategy` from keyword options; None values keep the defaults.

    Options: the fields of the strategy's config (MultiBlockConfig, MultiBlock3DConfig, RandomConfig),
    as values or as command-line text ('0.15,0.2'). For multiblock3d, npred / pred_scale /
    temporal_scale / max_temporal_keep hold one entry per mask pair (a scale entry is a number or a
    (low, high) pair).
    """
    if strategy not in CONFIGS:
        raise InputError(f"--strategy: unknown strategy {strategy!r} (choose from {', '.join(CONFIGS)})")
    given = {k: v for k, v in options.items() if v is not None}
    if "frames" in given and strategy != "multiblock3d":
        raise InputError(f"--frames is for 3D masks (multiblock3d), not --strategy {strategy}")
    unknown = set(given) - {f.name for f in dataclasses.fields(CONFIGS[strategy])}
    if unknown:
        names = ", ".join("--" + u.replace("_", "-") for u in sorted(unknown))
        raise InputError(f"{names}: not an option of --strategy {strategy}")
    if "grid" in given:
        grid = tuple(_number("grid", v, int) for v in _as_tuple(given["grid"]))
        if len(grid) != 2 or min(grid) < 1:
            raise InputError(f"--grid: expected a positive HxW, got {given['grid']!r}")
        given["grid"] = grid
    cls = CONFIGS[strategy]
    if strategy == "multiblock3d":
        if "npred" in given:
            given["npred"] = tuple(_number("npred", n, int) for n in _as_tuple(given["npred"]))
        pairs = len(given.get("npred", cls.npred))
        for name in ("pred_scale", "temporal_scale"):
            if name in given:
                given[name] = _per_pair_ranges(name, given[name], pairs)
            elif pairs != len(getattr(cls, name)):
                given[name] = (getattr(cls, name)[0],) * pairs if name == "temporal_scale" else None
        if given.get("pred_scale", True) is None:
            raise InputError(f"--pred-scale: give one scale per mask pair ({pairs} pairs from --npred)")
        if "max_temporal_keep" in given:
            given["max_temporal_keep"] = tuple(_number("max_temporal_keep", v, float)
                                               for v in _as_tuple(given["max_temporal_keep"]))
            if len(given["max_temporal_keep"]) == 1:
                given["max_temporal_keep"] *= pairs
        elif pairs != len(cls.max_temporal_keep):
            given["max_temporal_keep"] = (1.0,) * pairs
    for name in ("pred_scale", "aspect", "enc_scale", "enc_aspect", "ratio"):
        if name in given and not (strategy == "multiblock3d" and name == "pred_scale"):
            given[name] = _range(name, given[name])
    for name in ("npred", "min_keep", "context_size", "frames"):
        if name in given and not isinstance(given[name], tuple):
            given[name] = _number(name, given[name], int)
    return validate(cls(**given))


def _number(name: str, value: Any, kind: type) -> Any:
    """int(value) or float(value), else InputError naming the option (a recipe may hold a wrong type)."""
    exact = not isinstance(value, bool) and not (kind is int and isinstance(value, float) and not value.is_integer())
    if exact:
        try:
            return kind(value)
        except (TypeError, ValueError, OverflowError):
            pass
    expected = "an integer" if kind is int else "a number"
    raise InputError(f"--{name.replace('_', '-')}: expected {expected}, got {value!r}")


def _as_tuple(value: Any) -> tuple:
    if isinstance(value, str):
        return tuple(v for v in value.split(",") if v.strip())
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return (value,)


def _range(name: str, value: Any) -> tuple[float, float]:
    """'0.15,0.2', (0.15, 0.2) or a single number (a fixed value) -> (low, high)."""
    flag = "--" + name.replace("_", "-")
    try:
        parts = tuple(float(v) for v in _as_tuple(value))
    except (TypeError, ValueError):
        raise InputError(f"{flag}: expected low,high numbers, got {value!r}") from None
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2:
        raise InputError(f"{flag}: expected low,high (two numbers), got {value!r}")
    return parts  # type: ignore[return-value]


def _per_pair_ranges(name: str, value: Any, pairs: int) -> tuple[tuple[float, float], ...]:
    """'0.15,0.7' or '0.1:0.2,0.7' (one entry per pair, lo:hi for a range) -> ((lo, hi), ...)."""
    flag = "--" + name.replace("_", "-")
    items = _as_tuple(value)
    out = []
    for item in items:
        if isinstance(item, str):
            item = tuple(item.split(":"))
        try:
            parts = tuple(float(v) for v in (item if isinstance(item, (tuple, list)) else (item,)))
        except (TypeError, ValueError):
            raise InputError(f"{flag}: expected numbers or low:high ranges, got {value!r}") from None
        if len(parts) == 1:
            parts = parts * 2
        if len(parts) != 2:
            raise InputError(f"{flag}: expected a number or low:high per mask pair, got {value!r}")
        out.append(parts)
    if len(out) == 1 and pairs > 1:
        out = out * pairs
    if len(out) != pairs:
        raise InputError(f"{flag}: expected {pairs} entries (one per mask pair), got {len(out)}")
    return tuple(out)
