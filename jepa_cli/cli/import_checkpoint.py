"""`jepa import-checkpoint FILE.pth.tar -o RUN`: a published I-JEPA checkpoint as a run directory."""

from __future__ import annotations

import click

from jepa_cli.cli.common import emit, output_options, stderr_log


@click.command("import-checkpoint")
@click.argument("checkpoint", type=click.Path(path_type=str))
@click.option("-o", "--output", required=True, type=click.Path(path_type=str), help="The run directory to write.")
@click.option("--objective", type=click.Choice(["ijepa"]), default="ijepa", show_default=True,
              help="The checkpoint's objective (the official I-JEPA release).")
@click.option("--model", type=click.Choice(["tiny", "small", "base", "large", "huge", "giant"]), default="huge",
              show_default=True, help="The encoder's size (ViT-H/14 for the in1k and in22k releases).")
@click.option("--patch-size", type=click.IntRange(min=1), default=14, show_default=True, help="Patch size in pixels.")
@click.option("--image-size", type=click.IntRange(min=1), default=224, show_default=True,
              help="The training crop size (448 for the 448-px ViT-H/16 release).")
@click.option("--pred-depth", type=click.IntRange(min=1), default=12, show_default=True,
              help="Predictor depth (in1k_vith14: 12).")
@click.option("--pred-width", type=click.IntRange(min=4), default=384, show_default=True,
              help="Predictor width (in1k_vith14: 384).")
@click.option("--width", type=click.IntRange(min=4), default=None, help="Encoder width, overriding --model's.")
@click.option("--depth", type=click.IntRange(min=1), default=None, help="Encoder depth, overriding --model's.")
@click.option("--heads", type=click.IntRange(min=1), default=None, help="Encoder heads, overriding --model's.")
@click.option("--pred-heads", type=click.IntRange(min=1), default=None, help="Predictor heads (default: the encoder's).")
@click.option("--ipe", type=click.IntRange(min=1), default=625, show_default=True,
              help="Iterations per epoch of the official run: the imported step is epoch x ipe.")
@click.option("--epochs", type=click.IntRange(min=1), default=300, show_default=True,
              help="The official run's epochs (the schedules of a resumed run).")
@output_options
def command(checkpoint, output, objective, model, patch_size, image_size, pred_depth, pred_width, width, depth,
            heads, pred_heads, ipe, epochs, as_json, verbose, quiet):
    """Convert a published I-JEPA checkpoint into a run directory.

    Reads the official `torch.save` file (keys encoder, predictor, target_encoder; `module.`
    prefixes are dropped) without PyTorch, checks every tensor against the chosen model's shapes,
    and writes RUN with one checkpoint at step epoch x --ipe: the context encoder and predictor
    as params, the target encoder as the EMA. encode-latents, probe, ema-inspect and
    `train --resume` use it like any run (the optimizer's moments are not imported).

    \b
    Examples:
      jepa import-checkpoint IN1K-vit.h.14-300e.pth.tar -o runs/vith14-in1k
      jepa encode-latents runs/vith14-in1k val.zarr -o emb-val.zarr
    """
    from jepa_cli.training.import_official import ImportOptions, import_ijepa

    log = stderr_log(quiet or as_json and not verbose)
    config = {"model": model, "patch_size": patch_size, "image_size": image_size, "pred_depth": pred_depth,
              "pred_width": pred_width, "width": width, "depth": depth, "heads": heads, "pred_heads": pred_heads}
    options = ImportOptions(objective_config={k: v for k, v in config.items() if v is not None}, ipe=ipe,
                            epochs=epochs)
    result = import_ijepa(checkpoint, output, options, log=log)
    emit(result, as_json, lambda r: print(f"wrote {r['run']}: step {r['step']} (epoch {r['epoch']}), "
                                          f"{r['encoder_params']:,} encoder and {r['predictor_params']:,} "
                                          f"predictor parameters from {r['source']}"))
