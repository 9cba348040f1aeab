"""`jepa completion bash|zsh|fish`: print click's completion script for the shell."""

from __future__ import annotations

import click

SHELLS = ("bash", "zsh", "fish")


def completion_script(shell: str) -> str:
    """The completion script click generates for `jepa` in `shell`."""
    from click.shell_completion import get_completion_class

    from jepa_cli.cli.main import cli

    completion_class = get_completion_class(shell)
    return completion_class(cli, {}, "jepa", "_JEPA_COMPLETE").source()


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
def command(shell: str) -> None:
    """Print the shell completion script for bash, zsh or fish.

    \b
    Example:
      eval "$(jepa completion bash)"             # this shell
      jepa completion fish > ~/.config/fish/completions/jepa.fish
    """
    click.echo(completion_script(shell), nl=False)
