"""`jepa ingest SOURCE OUT.zarr`."""

from __future__ import annotations

import click

from jepa_cli.cli.common import SEED, emit, groups_phrase, output_options, progress_bar, stderr_console, stderr_log
from jepa_cli.cli.complete import complete_sources
from jepa_cli.cli.declared import HxW


def _list_builtins(ctx: click.Context, _param, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from jepa_cli.data.sources import BUILTINS

    for name, text in BUILTINS.items():
        click.echo(f"builtin:{name}\t{text}")
    ctx.exit(0)


@click.command("ingest")
@click.argument("source", required=True, shell_complete=complete_sources)
@click.argument("out", type=click.Path(dir_okay=True, file_okay=False), required=True)
@click.option("--labels", "labels_path",
              help="Labels file (.npy, .txt, IDX) for an array or IDX source; a path,label CSV for a folder "
              "(paths relative to it; a header may name more columns, e.g. path,label,speaker).")
@click.option("--size", type=HxW(), help="Resize with a center crop to HxW (needed when sample sizes differ).")
@click.option("--channels", type=click.Choice(["1", "3"]), help="Convert to 1 (grayscale) or 3 (RGB) channels.")
@click.option("--sample-rate", type=int, help="Audio: resample to this rate in Hz (default 32000).")
@click.option("--seconds", type=float, help="Audio: crop or zero-pad every clip to this length (default 10).")
@click.option("--label-regex", help="Folders: label = the first group that matched when this regex is searched in "
              "each file's stem, else the whole match, e.g. '^(\\d+)_'.")
@click.option("--group-regex", help="Folders: group = the first group that matched when this regex is searched in each "
              "file's path under SOURCE, e.g. '^(\\w+)_' (a speaker); --split keeps each group on one side.")
@click.option("--group-column", help="Group = this column of the --labels CSV; --split keeps each group on one side.")
@click.option("--split", type=click.Choice(["train", "test"]),
              help="Keep one side of a split, stratified by label or (with a group option) by group.")
@click.option("--test-fraction", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True), default=0.2,
              show_default=True, help="Fraction of each class in the test split.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the split.")
@click.option("--limit", type=click.IntRange(min=1), help="Keep at most N samples (after the split).")
@click.option("--skip-bad", is_flag=True, help="Skip files that cannot be decoded or converted, and report how many.")
@click.option("--force", is_flag=True, help="Replace OUT if it is a dataset (anything else is refused).")
@click.option("--frames", type=click.IntRange(min=1), help="Video: frames per clip (16 for files and frame folders).")
@click.option("--frame-stride", type=click.IntRange(min=1), help="Video: take every Nth frame (4 for files and frame folders).")
@click.option("--clips-per-video", type=click.IntRange(min=1), help="Video: clips per video, evenly spaced (1).")
@click.option("--list-builtins", is_flag=True, expose_value=False, is_eager=True, callback=_list_builtins,
              help="List the built-in sources and exit.")
@output_options
def command(source, out, labels_path, size, channels, sample_rate, seconds, label_regex, group_regex, group_column,
            split, test_fraction, seed, limit, skip_bad, force, frames, frame_stride, clips_per_video, as_json, verbose,
            quiet):
    """Put images, video clips, audio or arrays into a dataset directory (zarr v3).

    SOURCE is a folder of images (ROOT/<class>/* gives labels, or --labels CSV, or --label-regex), a
    folder of audio files (wav, flac, ogg, at any depth; labels as for images), one image
    file (a dataset of one sample), a .npy/.npz file, an IDX file (MNIST's format, .gz or not) or builtin:NAME (see --list-builtins).
    Video: a video file, a folder of them or of frame folders (ROOT/<class>/<clip>/*.png), a
    [N, T, H, W, C] array; a video shorter than one clip is padded with its last frame (skipped
    with --skip-bad).

    \b
    Example:
      jepa ingest builtin:digits digits-train.zarr --size 16x16 --split train --seed 0
      jepa ingest t10k-images-idx3-ubyte.gz mnist-test.zarr --labels t10k-labels-idx1-ubyte.gz
      jepa ingest videos/ clips.zarr --frames 16 --frame-stride 4 --size 64x64
      jepa ingest builtin:tones tones-train.zarr --sample-rate 16000 --seconds 1 --split train
      jepa ingest wavs/ train.zarr --label-regex '^(\\d+)_' --group-regex '_(\\w+)_' --split train
    """
    from jepa_cli.data.audio import is_audio_source

    if is_audio_source(source):
        from jepa_cli.cli.ingest_audio import ingest_audio_command

        for flag, value in (("--frames", frames), ("--frame-stride", frame_stride),
                            ("--clips-per-video", clips_per_video)):
            if value is not None:
                from jepa_cli.errors import InputError

                raise InputError(f"{flag} applies to video sources only ({source} is audio)")

        return ingest_audio_command(source, out, labels_path, size, channels, sample_rate, seconds, label_regex,
                                    group_regex, group_column, split, test_fraction, seed, limit, skip_bad, force,
                                    as_json, quiet)
    for flag, value in (("--sample-rate", sample_rate), ("--seconds", seconds)):
        if value is not None:
            from jepa_cli.errors import InputError

            raise InputError(f"{flag} applies to audio sources only ({source} is not one)")
    from jepa_cli.data.clips import ClipOptions
    from jepa_cli.data.ingest import ingest
    from jepa_cli.data.sources import open_source

    opened = open_source(source, labels_path, ClipOptions(frames, frame_stride, clips_per_video, skip_bad),
                         label_regex=label_regex, group_regex=group_regex, group_column=group_column)
    with progress_bar(f"ingest {source}", None, "files", quiet=quiet or as_json) as advance:
        summary = ingest(opened, out, size=size, channels=int(channels) if channels else None,
                         split=split, test_fraction=test_fraction, seed=seed, limit=limit, skip_bad=skip_bad,
                         force=force, progress=advance, on_total=advance.set_total, log=stderr_log(quiet))
    if summary["skipped"] and not as_json:
        stderr_console(quiet).print(f"skipped {summary['skipped']} unreadable file(s)", style="yellow")
    emit(summary, as_json, f"wrote {summary['path']}: {summary['shape']} uint8"
         + (f", {summary['num_classes']} classes" if summary["labelled"] else ", unlabelled")
         + groups_phrase(summary)
         + (f", skipped {summary['skipped']}" if summary["skipped"] else "")
         + (f", padded {summary['padded']} short clip(s)" if summary.get("padded") else ""))
