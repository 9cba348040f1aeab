"""`jepa import-checkpoint FILE -o RUN`: a published I-JEPA, V-JEPA or Audio-JEPA checkpoint as a run."""

from __future__ import annotations

import click

from jepa_cli.cli.common import emit, output_options, stderr_log
from jepa_cli.errors import InputError

# the I-JEPA model options and their defaults (in1k_vith14), below what a `jepa export` file records; V-JEPA and
# Audio-JEPA sizes are read from the shapes
IJEPA_DEFAULTS = {"model": "huge", "patch_size": 14, "image_size": 224, "pred_depth": 12, "pred_width": 384}
IJEPA_ONLY = ("model", "patch_size", "pred_depth", "pred_width", "width", "depth")


@click.command("import-checkpoint")
@click.argument("checkpoint", type=click.Path(path_type=str))
@click.option("-o", "--output", required=True, type=click.Path(path_type=str), help="The run directory to write.")
@click.option("--objective", type=click.Choice(["ijepa", "vjepa", "audio-jepa"]), default=None,
              help="The checkpoint's objective (default: told by the file; given, it must agree).")
@click.option("--model", type=click.Choice(["tiny", "small", "base", "large", "huge", "giant"]), default=None,
              help="I-JEPA: the encoder's size (default huge: ViT-H/14 for the in1k and in22k releases).")
@click.option("--patch-size", type=click.IntRange(min=1), default=None, help="I-JEPA: patch size in pixels (default 14).")
@click.option("--image-size", type=click.IntRange(min=1), default=None,
              help="The training crop size: I-JEPA default 224 (448 for the 448-px ViT-H/16 release); V-JEPA "
                   "default from the position embeddings.")
@click.option("--num-frames", type=click.IntRange(min=1), default=None,
              help="V-JEPA: frames per clip, to read the grid from the shapes (default 16, as every release; "
                   "needed for another size).")
@click.option("--mel-bins", type=click.IntRange(min=1), default=None,
              help="Audio-JEPA: mel bins of the spectrogram, to read the grid (default 128, the release's; "
                   "needed for another size).")
@click.option("--pred-depth", type=click.IntRange(min=1), default=None, help="I-JEPA: predictor depth (default 12).")
@click.option("--pred-width", type=click.IntRange(min=4), default=None, help="I-JEPA: predictor width (default 384).")
@click.option("--width", type=click.IntRange(min=4), default=None, help="I-JEPA: encoder width, overriding --model's.")
@click.option("--depth", type=click.IntRange(min=1), default=None, help="I-JEPA: encoder depth, overriding --model's.")
@click.option("--heads", type=click.IntRange(min=1), default=None,
              help="Encoder heads: overrides --model's (I-JEPA); needed for a V-JEPA or Audio-JEPA encoder of "
                   "another size than the releases.")
@click.option("--pred-heads", type=click.IntRange(min=1), default=None,
              help="Predictor heads (default: the encoder's; Audio-JEPA's release: 12).")
@click.option("--ipe", type=click.IntRange(min=1), default=None,
              help="Iterations per epoch of the official run: the imported step is epoch x ipe (default: I-JEPA "
                   "625, V-JEPA 300; Audio-JEPA's step is its global_step, and its ipe global_step / epoch).")
@click.option("--epochs", type=click.IntRange(min=1), default=None,
              help="The official run's epochs, for the schedules of a resumed run (default: I-JEPA 300, "
                   "V-JEPA 300, Audio-JEPA 50).")
@output_options
def command(checkpoint, output, objective, model, patch_size, image_size, num_frames, mel_bins, pred_depth,
            pred_width, width, depth, heads, pred_heads, ipe, epochs, as_json, verbose, quiet):
    """Convert a published I-JEPA, V-JEPA or Audio-JEPA checkpoint into a run directory.

    Reads the official file without PyTorch and without running any code in it: the
    facebookresearch/ijepa and facebookresearch/jepa `torch.save` dicts (encoder, predictor,
    target_encoder; `module.` and `backbone.` prefixes dropped) and Audio-JEPA's Lightning
    checkpoint (its state_dict). V-JEPA (ViT-L/16, ViT-H/16, ViT-H/16 at 384 px) and Audio-JEPA
    (ViT-B/16) sizes are read from the tensors' shapes; I-JEPA's are given by the options. A file
    `jepa export` wrote (.pth.tar, .ckpt or .safetensors) records its model's size and reads back
    without options (given ones win); one of a single encoder imports as an encoder-only run, which
    encodes and probes but cannot be resumed. Every
    shape is checked before a tensor is read, and RUN gets one checkpoint: the context encoder and
    predictor as params, the target encoder as the EMA. encode-latents, probe, ema-inspect and
    `train --resume` use it like any run (the optimizer's moments are not imported).

    \b
    Examples:
      jepa import-checkpoint IN1K-vit.h.14-300e.pth.tar -o runs/vith14-in1k
      jepa import-checkpoint vitl16.pth.tar -o runs/vjepa-vitl16
      jepa encode-latents runs/vjepa-vitl16 clips.zarr -o emb.zarr
    """
    from jepa_cli.training.import_official import ImportOptions, import_checkpoint
    from jepa_cli.training.official_read import detect_family, read_checkpoint

    log = stderr_log(quiet or as_json and not verbose)
    given = {"model": model, "patch_size": patch_size, "image_size": image_size, "pred_depth": pred_depth,
             "pred_width": pred_width, "width": width, "depth": depth, "heads": heads, "pred_heads": pred_heads,
             "num_frames": num_frames, "mel_bins": mel_bins}
    family = objective
    if family is None:
        from pathlib import Path

        family = detect_family(read_checkpoint(Path(checkpoint)), Path(checkpoint))
    misplaced = [k for k, v in given.items() if v is not None and (
        (family != "ijepa" and k in IJEPA_ONLY) or (family != "vjepa" and k == "num_frames")
        or (family != "audio-jepa" and k == "mel_bins") or (family == "audio-jepa" and k == "image_size"))]
    if misplaced:
        flag = "--" + misplaced[0].replace("_", "-")
        raise InputError(f"{flag} does not apply to {checkpoint}, a {family} checkpoint (its sizes are read from "
                         "its shapes)" if family != "ijepa" else f"{flag} applies to V-JEPA or Audio-JEPA checkpoints, "
                         f"and {checkpoint} is an I-JEPA one")
    config = {k: v for k, v in given.items() if v is not None}
    options = ImportOptions(objective_config=config, defaults=IJEPA_DEFAULTS if family == "ijepa" else {}, ipe=ipe,
                            epochs=epochs)
    result = import_checkpoint(checkpoint, output, options, objective=objective, log=log)
    emit(result, as_json, lambda r: print(f"wrote {r['run']}: {r['objective']} step {r['step']} (epoch {r['epoch']}), "
                                          f"{r['encoder_params']:,} encoder and {r['predictor_params']:,} "
                                          f"predictor parameters from {r['source']}"))
