"""Objective options, declared once: a field of an objective's config dataclass (the model, the masks,
the objective's own) with its default, its type annotation and, in its metadata, its help and whether
`jepa train` takes it as a flag.

From that one field come: the TOML key in the objective's table (`[ijepa]`), the key in run.json's
objective_config, the `jepa train --FLAG` option with the help and the default `--help` shows, the
`JEPA_TRAIN_<FLAG>` variable, and the options of `jepa mask`. This module and the config modules
that use it import neither JAX nor click, so `--help` and option checks run before JAX loads.
(The trainer's own keys are declared the same way, with a value rule, in training/config.py.)
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from jepa_cli.errors import InputError
from jepa_cli.fieldtypes import BOOL_WORDS


def option(default: Any, help: str, *, flag: bool = False, applies: tuple[str, ...] | None = None,
           choices: tuple[str, ...] | None = None, metavar: str | None = None) -> Any:
    """A dataclass field that is an objective option: `help` (one sentence, no default: --help adds
    it), `flag` (a `jepa train` option), `applies` (the objectives that read it, when a config class
    serves several), `choices` (the values a str option accepts, checked before JAX loads) and
    `metavar` (what --help calls a text value, such as PATTERN; None: the kind's name)."""
    return dataclasses.field(default=default, metadata={"help": help, "flag": flag, "applies": applies,
                                                        "choices": choices, "metavar": metavar})


def option_of(cls: type, name: str, default: Any) -> Any:
    """`cls`'s option field `name` (its help, flag, applies and choices) with another default: a config
    that reuses another's option with its own recipe's value (Audio-JEPA's model fields)."""
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    return dataclasses.field(default=default, metadata=dict(field.metadata))


@dataclasses.dataclass(frozen=True)
class Flag:
    """A command-line form of an option field: `kind` is how its text is read (bool: a switch; range:
    'LO,HI'; size: 'S' or 'HxW'; list: as written, for the config's parser), `default` the declaring
    class's default (shown by --help)."""

    name: str
    kind: str
    help: str
    default: Any
    choices: tuple[str, ...] | None = None
    applies: tuple[str, ...] | None = None
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def default_text(self) -> str | None:
        """The default as the command line writes it (224x320 for a size), None when there is none."""
        if self.default is None:
            return None
        if self.kind == "size" and isinstance(self.default, (tuple, list)):
            return "x".join(map(str, self.default))
        return shown(self.default)


def _kind(hint: Any) -> str:
    """The Flag kind of an annotation: bool, int, float, str (None allowed in each), a pair of
    floats (range), (int, int) or an int or (int, int) (size), any other tuple (list: text that the
    config's own parser reads, such as the per-pair scales of 3D masks)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] if _is_union(hint) else [hint]
    if any(typing.get_origin(a) is tuple for a in args):
        items = typing.get_args(next(a for a in args if typing.get_origin(a) is tuple))
        return {(int, int): "size", (float, float): "range"}.get(items, "list")
    for kind in (bool, int, float, str):
        if kind in args:
            return kind.__name__
    raise TypeError(f"no command-line form for {hint!r}")


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def flags(*classes: type, flagged_only: bool = True) -> list[Flag]:
    """The Flags of the option fields of `classes` (only those marked `flag` unless `flagged_only` is
    False), in declaration order; a name declared by several classes comes from the first."""
    out: dict[str, Flag] = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            meta = field.metadata
            if field.name in out or "help" not in meta or (flagged_only and not meta["flag"]):
                continue
            out[field.name] = Flag(field.name, _kind(hints[field.name]), meta["help"], field.default,
                                   meta["choices"], meta["applies"], meta.get("metavar"))
    return list(out.values())


def shown(value: Any) -> str:
    """A default as the command line would write it: 0.15,0.2 for a pair, 0.15:0.15,0.7:0.7 for one
    pair per mask pair, true/false, 224, "" for an empty string."""
    if value == "":
        return '""'
    if isinstance(value, (tuple, list)):
        return ",".join(":".join(map(shown, v)) if isinstance(v, (tuple, list)) else shown(v) for v in value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def parse(flag: Flag, text: str, source: str) -> Any:
    """The value of `flag` from command-line or environment text, as the TOML key would hold it
    (a range as [lo, hi], a size as S or [H, W]); InputError naming `source` on bad text."""
    words = text.replace(" ", "")
    if flag.kind == "list":
        return words
    try:
        if flag.kind == "bool":
            return BOOL_WORDS[words.lower()]
        if flag.kind == "int":
            return int(words)
        if flag.kind == "float":
            return float(words)
        if flag.kind == "range":
            low, high = (float(p) for p in words.split(","))
            return [low, high]
        if flag.kind == "size":
            parts = [int(p) for p in words.lower().split("x")]
            if min(parts) <= 0:
                raise ValueError
            if len(parts) == 1 or (len(parts) == 2 and parts[0] == parts[1]):
                return parts[0]
            if len(parts) == 2:
                return parts
            raise ValueError
    except (ValueError, KeyError):
        expected = {"bool": "true or false", "int": "an integer", "float": "a number",
                    "range": "LO,HI such as 0.15,0.2", "size": "positive S or HxW such as 224 or 224x320"}[flag.kind]
        raise InputError(f"{source}: expected {expected}, got {text!r}") from None
    if flag.choices and words not in flag.choices:
        raise InputError(f"{source}: expected one of {', '.join(flag.choices)}, got {text!r}")
    return words
