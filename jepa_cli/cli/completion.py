"""`jepa completion bash|zsh|fish`: print click's completion script for the shell."""

from __future__ import annotations

import click

SHELLS = ("bash", "zsh", "fish")

# click's bash script, except that a word bash split at ':' (COMP_WORDBREAKS holds it: `builtin:d` reaches
# the function as `builtin`, `:`, `d`) is joined again before jepa sees it, and the part up to its last
# ':' is cut from each answer, since bash replaces only the piece after the colon. bash-completion's
# _get_comp_words_by_ref -n : and __ltrim_colon_completions do the same; this needs no bash-completion.
BASH_SOURCE = """\
%(complete_func)s() {
    local IFS=$'\\n'
    local response words=() cword=0 i

    for ((i = 0; i < ${#COMP_WORDS[@]}; i++)); do
        if ((i > 0)) && [[ ${COMP_WORDS[i]} == ':' || ${words[${#words[@]}-1]} == *: ]]; then
            words[${#words[@]}-1]+=${COMP_WORDS[i]}
        else
            words+=("${COMP_WORDS[i]}")
        fi
        ((i == COMP_CWORD)) && cword=$((${#words[@]} - 1))
    done
    local cur=${words[cword]} prefix=''
    [[ $COMP_WORDBREAKS == *:* && $cur == *:* ]] && prefix=${cur%%"${cur##*:}"}

    response=$(env COMP_WORDS="${words[*]}" COMP_CWORD=$cword %(complete_var)s=bash_complete $1)

    for completion in $response; do
        IFS=',' read type value <<< "$completion"

        if [[ $type == 'dir' ]]; then
            COMPREPLY=()
            compopt -o dirnames
        elif [[ $type == 'file' ]]; then
            COMPREPLY=()
            compopt -o default
        elif [[ $type == 'plain' ]]; then
            COMPREPLY+=("${value#"$prefix"}")
        fi
    done

    return 0
}

%(complete_func)s_setup() {
    complete -o nosort -F %(complete_func)s %(prog_name)s
}

%(complete_func)s_setup;
"""


def completion_script(shell: str) -> str:
    """The completion script for `jepa` in `shell`: click's, with BASH_SOURCE for bash."""
    from click.shell_completion import BashComplete, get_completion_class

    from jepa_cli.cli.main import cli

    class JepaBashComplete(BashComplete):
        source_template = BASH_SOURCE

    completion_class = JepaBashComplete if shell == "bash" else get_completion_class(shell)
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
