"""`jepa export RUN -o FILE`: a run's weights in the official layout, as safetensors or a PyTorch checkpoint."""

from __future__ import annotations

import click

from jepa_cli.cli.common import emit, output_options, warn
from jepa_cli.cli.complete import complete_runs, complete_steps


@click.command("export")
@click.argument("run", type=click.Path(path_type=str), shell_complete=complete_runs)
@click.option("-o", "--output", default=None, type=click.Path(path_type=str),
              help="The file to write: FILE.safetensors, or a PyTorch checkpoint FILE.pth.tar (FILE.ckpt for "
                   "Audio-JEPA's Lightning); the format follows the name; never an existing path.")
@click.option("--step", type=click.IntRange(min=0), default=None, shell_complete=complete_steps,
              help="Checkpoint step (default: the latest).")
@click.option("--weights", type=click.Choice(["target", "context"]), default=None,
              help="The encoder written without --all: the EMA target (default, as the JEPAs evaluate; key "
                   "target_encoder) or the context encoder (key encoder).")
@click.option("--all", "full", is_flag=True,
              help="Write the context encoder, the predictor and the target encoder: the whole official "
                   "checkpoint, which `jepa import-checkpoint` and the official training code read.")
@click.option("--print-snippet", "print_snippet", is_flag=True,
              help="Print the PyTorch code that loads RUN's export into the official encoder class at RUN's size "
                   "and runs it on an input normalised as RUN's was (strict load, one forward pass); writes "
                   "nothing, needs no -o.")
@output_options
def command(run, output, step, weights, full, print_snippet, as_json, verbose, quiet):
    """Export a run's weights in the official layout, for PyTorch.

    Writes the encoder of RUN's latest (or --step) checkpoint under the official names and layouts
    of its objective, with its fixed pos_embed table, so the official code loads it: I-JEPA
    (facebookresearch/ijepa), V-JEPA (facebookresearch/jepa) or Audio-JEPA (LudovicTuncay/Audio-JEPA).
    FILE.pth.tar is the checkpoint the official trainer saves, written without PyTorch and read by
    torch.load(weights_only=True): for I-JEPA and V-JEPA a dict of parts (names prefixed by
    `module.`, V-JEPA's by `module.backbone.`) and epoch; for Audio-JEPA Lightning's epoch,
    global_step and state_dict (`encoder.`, `target_encoder.`, `predictor.` names).
    FILE.safetensors holds one encoder under bare names (with --all: each name prefixed by its
    part). `jepa import-checkpoint` reads an --all .pth.tar back into the same weights, with no
    options: the model's size is recorded under a key the official loaders ignore (`jepa_model`).
    The optimizer's moments are not written. A run the official model cannot compute (another
    token mixer, another LayerNorm epsilon than the official one, non-square audio patches, a
    normalised log-mel input) is refused, as is one the official classes are not built for (I-JEPA
    or V-JEPA images that are not square, one-frame V-JEPA clips). --print-snippet prints the
    PyTorch code of the hand-off instead of writing a file.

    \b
    Examples:
      jepa export runs/ijepa -o ijepa-target.safetensors
      jepa export runs/ijepa -o ijepa.pth.tar --all
      jepa export runs/audio -o audio-jepa.ckpt --all
      jepa export runs/ijepa --print-snippet > load_ijepa.py
    """
    from jepa_cli.errors import InputError
    from jepa_cli.training.export_official import export_run

    if print_snippet:
        from jepa_cli.training.export_official import snippet

        if output is not None or full or weights is not None or step is not None or as_json:
            raise InputError("--print-snippet prints code and writes nothing: it takes no -o, --all, --weights, "
                             "--step or --json")
        click.echo(snippet(run), nl=False)
        return
    if output is None:
        raise InputError("-o/--output FILE is required (or --print-snippet)")
    if full and weights is not None:
        raise InputError("--weights chooses the one encoder written without --all; --all writes both")
    result = export_run(run, output, step=step, weights=weights or "target", full=full,
                        on_log=lambda message: warn(message, quiet))
    emit(result, as_json, lambda r: print(f"wrote {r['output']}: {', '.join(r['parts'])} of {r['run']} at step "
                                          f"{r['step']} ({r['tensors']} tensors, {r['parameters']:,} parameters, "
                                          f"{r['format']})"))
