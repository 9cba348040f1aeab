"""Click options from option declarations (jepa_cli/options.py), and the environment-variable rule every
command follows (docs/cli-conventions.md): JEPA_<COMMAND>_<OPTION> stands for `--option`, below the
command line; its text is read as the option's would be, and a bad value names the variable."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import click
from click.core import ParameterSource

from jepa_cli import options
from jepa_cli.errors import InputError


def declared_option(flag: options.Flag, help_text: str, **extra: Any) -> Callable:
    """The click option of a declared option: its spellings (a switch also gets --no-X), its text read
    by options.parse, and no default (None: not given, so a recipe's value shows through)."""
    if flag.kind == "bool":
        return click.option(f"{flag.flag}/--no-{flag.flag[2:]}", flag.name, type=_Switch(flag), default=None,
                            help=help_text, **extra)
    kind = _Choice(flag) if flag.choices else _Text(flag)
    return click.option(*flag.names[1:], flag.flag, flag.name, type=kind, default=None, help=help_text, **extra)


class _Declared:
    """Text from the command line or the environment, read by options.parse, which names its source."""

    flag: options.Flag

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str) or param is None:
            return value
        return options.parse(self.flag, value, source(ctx, param))


class _Text(_Declared, click.ParamType):
    def __init__(self, flag: options.Flag) -> None:
        self.flag = flag
        self.name = flag.metavar or {"int": "integer", "float": "float", "range": "LO,HI", "size": "HxW"}.get(
            flag.kind, "text")


class _Choice(_Declared, click.Choice):
    """Shown and completed as a choice; 'module:factory' too where the option allows one."""

    def __init__(self, flag: options.Flag) -> None:
        super().__init__(flag.choices)
        self.flag = flag


class _Switch(_Declared, click.types.BoolParamType):
    def __init__(self, flag: options.Flag) -> None:
        self.flag = flag


def text_type(kind: str) -> click.ParamType:
    """The type of an undeclared option whose text is of `kind` ('range': LO,HI), read by
    options.parse as a declared option's is."""
    return _Text(options.Flag("", kind, "", None))


class HxW(click.ParamType):
    """An undeclared option's S or HxW text as a (height, width) pair (options.parse_hxw)."""

    name = "HxW"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str) or param is None:
            return value
        return options.parse_hxw(value, source(ctx, param))


def source(ctx: click.Context | None, param: click.Parameter) -> str:
    """Where `param`'s value was written: its variable (JEPA_TRAIN_BATCH_SIZE) when the environment
    gave it, else its longest spelling (--batch-size)."""
    if ctx is not None and ctx.get_parameter_source(param.name) is ParameterSource.ENVIRONMENT:
        return variable(ctx, param)
    return max(param.opts, key=len) if param.opts else param.human_readable_name


def variable(ctx: click.Context, param: click.Parameter) -> str:
    """The environment variable that stands for `param`: JEPA_<COMMAND>_<OPTION> (click's automatic
    name under the root's auto_envvar_prefix, cli/main.py)."""
    if isinstance(param.envvar, str):
        return param.envvar
    return f"{ctx.auto_envvar_prefix}_{param.name.upper()}"


def check_variables(command: click.Command, prefix: str, environ: Mapping[str, str],
                    others: tuple[str, ...] = ()) -> None:
    """InputError for a set `PREFIX<NAME>` variable (JEPA_TRAIN_BATCHSIZE) that stands for no option
    of `command` (a typo would otherwise be ignored), naming the right variable where NAME spells an
    option whose key differs (JEPA_MASK_BATCH_SIZE for `--batch-size`, whose key is `batch`);
    variables under another command's prefix in `others` (JEPA_ENCODE_ beside JEPA_ENCODE_LATENTS_)
    are that command's."""
    params = [param for param in command.params if isinstance(param, click.Option)]
    known = {param.name.upper() for param in params}
    spelt = {opt[2:].upper().replace("-", "_"): (opt, param.name.upper())
             for param in params for opt in param.opts if opt.startswith("--")}
    for name in sorted(environ):
        rest = name[len(prefix):]
        if not name.startswith(prefix) or not environ[name] or rest in known \
                or any(name.startswith(other) for other in others if len(other) > len(prefix)):
            continue
        if rest in spelt:
            raise InputError(f"{name}: `jepa {command.name} {spelt[rest][0]}` is set by {prefix}{spelt[rest][1]}")
        raise InputError(f"{name}: `jepa {command.name}` has no option --{rest.lower().replace('_', '-')} "
                         f"({prefix}<OPTION> sets an option of `jepa {command.name} --help`)")
