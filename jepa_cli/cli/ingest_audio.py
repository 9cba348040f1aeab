"""`jepa ingest` of an audio source (a folder of wav/flac/ogg, or builtin:tones): the audio branch of
cli/ingest.py, in its own module so that the image command holds no audio code."""

from __future__ import annotations

from jepa_cli.cli.common import emit, groups_phrase, progress_bar, stderr_console, stderr_log


def ingest_audio_command(source, out, labels_path, size, channels, sample_rate, seconds, label_regex, group_regex,
                         group_column, split, test_fraction, seed, limit, skip_bad, force, as_json, quiet) -> None:
    from jepa_cli.data.audio import DEFAULT_SAMPLE_RATE, DEFAULT_SECONDS, ingest_audio, open_audio_source
    from jepa_cli.errors import InputError

    for flag, value in (("--size", size), ("--channels", channels)):
        if value is not None:
            raise InputError(f"{flag} applies to images only ({source} is an audio source)")
    opened = open_audio_source(source, labels_path, label_regex, group_regex, group_column)
    with progress_bar(f"ingest {source}", None, "clips", quiet=quiet or as_json) as advance:
        summary = ingest_audio(opened, out, sample_rate=DEFAULT_SAMPLE_RATE if sample_rate is None else sample_rate,
                               seconds=DEFAULT_SECONDS if seconds is None else seconds, split=split,
                               test_fraction=test_fraction, seed=seed, limit=limit, skip_bad=skip_bad, force=force,
                               progress=advance, on_total=advance.set_total, log=stderr_log(quiet))
    if summary["skipped"] and not as_json:
        stderr_console(quiet).print(f"skipped {summary['skipped']} unreadable file(s)", style="yellow")
    emit(summary, as_json, f"wrote {summary['path']}: {summary['shape']} float32 audio at {summary['sample_rate']} Hz"
         + (f", {summary['num_classes']} classes" if summary["labelled"] else ", unlabelled")
         + groups_phrase(summary)
         + (f", skipped {summary['skipped']}" if summary["skipped"] else ""))
