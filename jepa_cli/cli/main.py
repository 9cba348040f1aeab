"""The `jepa` root command: a lazy group, so `jepa --help` and completion never import JAX."""

from __future__ import annotations

import importlib
import os
import sys

import click

from jepa_cli import __version__
from jepa_cli.errors import JepaError

# name -> (module, one-line summary). Modules are imported only when their command runs, so the
# summaries live here: `jepa --help` must not import a subcommand's dependencies.
COMMANDS: dict[str, tuple[str, str]] = {
    "ingest": ("jepa_cli.cli.ingest", "Put images or arrays into a dataset directory (zarr v3)."),
    "mask": ("jepa_cli.cli.mask", "Sample JEPA context/target masks; write, show, picture or summarize them."),
    "info": ("jepa_cli.cli.info", "Describe a dataset, mask file, embedding set or run."),
    "probe": ("jepa_cli.cli.probe", "Score frozen features with a linear, k-NN or attentive probe."),
    "encode-latents": ("jepa_cli.cli.encode", "Encode a dataset with a trained encoder into a latent dataset."),
    "train": ("jepa_cli.cli.train", "Pretrain an encoder on a dataset (I-JEPA by default) with the official recipe."),
    "ema-inspect": ("jepa_cli.cli.ema_inspect", "Show the EMA momentum schedule of a run and how far the EMA is from the online weights."),
    "completion": ("jepa_cli.cli.completion", "Print the shell completion script for bash, zsh or fish."),
}


class JepaGroup(click.Group):
    """Loads subcommands on demand and turns every error into one `jepa: error:` line."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module = importlib.import_module(COMMANDS[name][0])
        return module.command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            rv = super().main(args=args, prog_name=prog_name or "jepa", complete_var=complete_var,
                              standalone_mode=False, **extra)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.Abort:
            _fail("interrupted", 130)
        except click.ClickException as exc:
            _fail(exc.format_message(), 2)
        except JepaError as exc:
            if os.environ.get("JEPA_DEBUG") == "1":
                raise
            _fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, no traceback
            if os.environ.get("JEPA_DEBUG") == "1":
                raise
            _fail(f"{type(exc).__name__}: {exc} (rerun with JEPA_DEBUG=1 for the traceback)", 1)
        if isinstance(rv, int) and rv:
            sys.exit(rv)
        sys.exit(0)


def _fail(message: str, code: int) -> None:
    line = " ".join(str(message).split())  # one line, whatever the message held
    click.echo(f"jepa: error: {line}", err=True)
    sys.exit(code)


@click.group(cls=JepaGroup, context_settings={"auto_envvar_prefix": "JEPA", "help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="jepa")
def cli() -> None:
    """jepa: joint-embedding predictive self-supervised learning from the shell.

    Subcommands exchange zarr v3 arrays and orbax checkpoints on disk.
    Results go to stdout (--json for one JSON object), logs and progress to stderr.
    """


def main() -> None:
    cli.main()
