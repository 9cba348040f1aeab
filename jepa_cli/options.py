"""Options, declared once: a field of a config dataclass (the trainer's TrainConfig, an objective's,
the model's, the masks') with its default, its type annotation and, in its metadata, its help, what
it accepts (choices, bounds) and whether `jepa train` takes it as a flag.

From that one field come: the TOML key (a trainer key at the recipe's top level, an objective option
in its table, `[ijepa]`), the run.json entry, the `jepa train --FLAG` option with the help and the
default `--help` shows, its JEPA_TRAIN_<KEY> variable (docs/cli-conventions.md), the options of `jepa
mask`, one reading of a value's text (`parse`: a command-line word or its variable) and one check of
a value (`check`: a parsed one, or a trainer key's in a recipe or run.json), each failure one message
naming where the value was written. This module and the config modules that use it import neither
JAX nor click, so `--help` and option checks run before JAX loads.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

from jepa_cli.errors import InputError

# The words a true/false value may be written as in an environment variable: those click reads for
# every other command's switches, so that one set holds for all
BOOL_WORDS = {**dict.fromkeys(("true", "t", "yes", "y", "on", "1"), True),
              **dict.fromkeys(("false", "f", "no", "n", "off", "0"), False)}
SIZE_TEXT = "positive S or HxW such as 224 or 224x320"


def option(default: Any, help: str, *, flag: bool = False, applies: tuple[str, ...] | None = None,
           choices: tuple[str, ...] | None = None, metavar: str | None = None, low: float | None = None,
           above: float | None = None, high: float | None = None, below: float | None = None,
           names: tuple[str, ...] = (), allow_module: bool = False) -> Any:
    """A dataclass field that is an option: `help` (one sentence, no default: --help adds it), `flag`
    (a `jepa train` option), `applies` (the objectives that read it, when a config class serves
    several), `choices` (the values a str option accepts, checked before JAX loads), `metavar` (what
    --help calls a text value, such as PATTERN; None: the kind's name), the bounds of a number or of
    each number of a pair (value >= low, > above, <= high, < below), `names` (the command-line
    spellings, the first the main one; default --NAME) and `allow_module` (a str that may also be
    'module:factory', beside the choices)."""
    return dataclasses.field(default=default, metadata={
        "help": help, "flag": flag, "applies": applies, "choices": choices, "metavar": metavar, "low": low,
        "above": above, "high": high, "below": below, "names": names, "allow_module": allow_module})


def option_of(cls: type, name: str, default: Any) -> Any:
    """`cls`'s option field `name` (its help, flag, applies and choices) with another default: a config
    that reuses another's option with its own recipe's value (Audio-JEPA's model fields)."""
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    return dataclasses.field(default=default, metadata=dict(field.metadata))


@dataclasses.dataclass(frozen=True)
class Flag:
    """The command-line form of an option field: `kind` is how its text is read (bool: a switch;
    range: two numbers 'LO,HI'; size: 'S' or 'HxW'; list: as written, for the config's parser),
    `default` the declaring class's default (shown by --help), `nullable` whether None (not set) is a
    value, the rest as `option` declares them."""

    name: str
    kind: str
    help: str
    default: Any
    choices: tuple[str, ...] | None = None
    applies: tuple[str, ...] | None = None
    metavar: str | None = None
    nullable: bool = False
    low: float | None = None
    above: float | None = None
    high: float | None = None
    below: float | None = None
    names: tuple[str, ...] = ()
    allow_module: bool = False

    @property
    def flag(self) -> str:
        return self.names[0] if self.names else "--" + self.name.replace("_", "-")

    @property
    def default_text(self) -> str | None:
        """The default as the command line writes it (224x320 for a size), None when there is none."""
        if self.default is None:
            return None
        if self.kind == "size" and isinstance(self.default, (tuple, list)):
            return "x".join(map(str, self.default))
        return shown(self.default)

    def describe(self) -> str:
        """What the option accepts, as an error message says it: `an integer >= 1`."""
        if self.kind == "size":
            return SIZE_TEXT
        if self.choices:
            return "one of " + ", ".join(self.choices) + (" or module:factory" if self.allow_module else "")
        text = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string",
                "range": "two numbers", "list": "a list"}[self.kind]
        if self.low is not None and self.high is not None:
            text += f" in {self.low}..{self.high}"
        elif self.low is not None and self.below is not None:
            text += f" in [{self.low}, {self.below})"
        elif self.low is not None or self.above is not None:
            text += f" >= {self.low}" if self.low is not None else f" > {self.above}"
        return text + (f" such as {shown(self.default)}" if self.kind == "range" and self.default else "")

    def accepts(self, value: Any) -> bool:
        """Whether `value` (as TOML, run.json or `parse` holds it) is one this option takes."""
        if value is None:
            return self.nullable
        if self.kind in ("bool", "str"):
            return isinstance(value, {"bool": bool, "str": str}[self.kind]) and (
                not self.choices or value in self.choices or (self.allow_module and ":" in value))
        if self.kind == "list":
            return True
        if isinstance(value, (list, tuple)) and self.kind in ("range", "size"):  # a pair, each number checked
            return len(value) == 2 and all(self._number(v, "float" if self.kind == "range" else "int") for v in value)
        return self.kind != "range" and self._number(value, "int" if self.kind == "size" else self.kind)

    def _number(self, value: Any, kind: str) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or (kind == "int" and not isinstance(value, int)):
            return False
        low, above = (1, None) if self.kind == "size" else (self.low, self.above)
        return ((low is None or value >= low) and (above is None or value > above)
                and (self.high is None or value <= self.high) and (self.below is None or value < self.below))


def _kind(hint: Any) -> tuple[str, bool]:
    """The Flag kind of an annotation and whether it allows None: bool, int, float, str, a pair of
    floats (range), (int, int) or an int or (int, int) (size), any other tuple (list: text that the
    config's own parser reads, such as the per-pair scales of 3D masks)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    args = [a for a in typing.get_args(hint) if a is not type(None)] if union else [hint]
    nullable = union and type(None) in typing.get_args(hint)
    if any(typing.get_origin(a) is tuple for a in args):
        items = typing.get_args(next(a for a in args if typing.get_origin(a) is tuple))
        return {(int, int): "size", (float, float): "range"}.get(items, "list"), nullable
    for kind in (bool, int, float, str):
        if kind in args:
            return kind.__name__, nullable
    raise TypeError(f"no command-line form for {hint!r}")


def flags(*classes: type, flagged_only: bool = True) -> list[Flag]:
    """The Flags of the option fields of `classes` (only those marked `flag` unless `flagged_only` is
    False), in declaration order; a name declared by several classes comes from the first."""
    out: dict[str, Flag] = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            meta = dict(field.metadata)
            if field.name in out or "help" not in meta or (flagged_only and not meta["flag"]):
                continue
            del meta["flag"]
            kind, nullable = _kind(hints[field.name])
            out[field.name] = Flag(field.name, kind, default=field.default, nullable=nullable, **meta)
    return list(out.values())


def shown(value: Any) -> str:
    """A default as the command line would write it: 0.15,0.2 for a pair, 0.15:0.15,0.7:0.7 for one
    pair per mask pair, true/false, 224, "" for an empty string."""
    if value == "":
        return '""'
    if isinstance(value, (tuple, list)):
        return ",".join(":".join(map(shown, v)) if isinstance(v, (tuple, list)) else shown(v) for v in value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def check(flag: Flag, value: Any, source: str) -> None:
    """InputError `SOURCE must be <what FLAG accepts>, got VALUE` unless `flag` accepts `value`;
    `source` is where the value was written (`--batch-size`, `JEPA_TRAIN_BATCH_SIZE`, `r.toml: batch_size`)."""
    if not flag.accepts(value):
        raise InputError(f"{source} must be {flag.describe()}, got {value!r}")


def parse(flag: Flag, text: str, source: str) -> Any:
    """The value of `flag` from its text (a command-line word or an environment variable), as the TOML
    key would hold it (a range as [lo, hi], a size as S or [H, W]) and checked as `check` does;
    InputError naming `source` on bad text."""
    words = text.replace(" ", "")
    try:
        if flag.kind == "size":
            height, width = parse_hxw(text, source)
            value: Any = height if height == width else [height, width]
        elif flag.kind in ("int", "float"):
            value = {"int": int, "float": float}[flag.kind](words)
        elif flag.kind == "range":
            low, high = (float(p) for p in words.split(","))
            value = [low, high]
        else:
            value = {"bool": lambda: BOOL_WORDS[words.lower()], "list": lambda: words, "str": lambda: text}[flag.kind]()
    except (ValueError, KeyError):
        raise InputError(f"{source} must be {flag.describe()}, got {text!r}") from None
    check(flag, value, source)
    return value


def parse_hxw(text: str, source: str) -> tuple[int, int]:
    """'224x320' -> (224, 320), '224' -> (224, 224): a size as the command line writes it (height x
    width, in pixels or patches); InputError naming `source` unless it is one or two positive integers."""
    try:
        parts = tuple(int(p) for p in text.replace(" ", "").lower().split("x"))
    except ValueError:
        parts = ()
    parts = parts * 2 if len(parts) == 1 else parts
    if len(parts) != 2 or min(parts) <= 0:
        raise InputError(f"{source} must be {SIZE_TEXT}, got {text!r}")
    return parts  # type: ignore[return-value]
