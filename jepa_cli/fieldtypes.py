"""Checking a config dataclass's values against its fields' annotations, so that a recipe value of
the wrong type (`depth = "two"` in TOML) is one clear error naming the option, not a TypeError deep
inside model construction."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

from jepa_cli.errors import InputError


def check_field_types(config: Any, owner: str) -> None:
    """InputError `OWNER option NAME must be <type>, got VALUE` for the first field of the dataclass
    instance `config` whose value does not fit its annotation (int, float, bool, str, None, unions
    and tuples of those; anything else is not checked). Lists count as tuples (TOML has no tuples)."""
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        value, hint = getattr(config, field.name), hints[field.name]
        if not _fits(value, hint):
            raise InputError(f"{owner} option {field.name} must be {_describe(hint)}, got {value!r}")


def _fits(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    if origin is tuple:
        if not isinstance(value, (tuple, list)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_fits(v, args[0]) for v in value)
        return len(value) == len(args) and all(_fits(v, a) for v, a in zip(value, args))
    return True


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args if a is not type(None))  # TOML cannot write None
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s"
        return f"a list of {len(args)} values ({', '.join(_describe(a) for a in args)})"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(hint, str(hint))
