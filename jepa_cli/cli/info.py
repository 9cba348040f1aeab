"""`jepa info PATH`."""

from __future__ import annotations

from typing import Any

import click

from jepa_cli.cli.common import emit, output_options, print_mapping, sparkline, stdout_console
from jepa_cli.cli.complete import complete_runs_or_datasets


@click.command("info")
@click.argument("path", type=click.Path(), shell_complete=complete_runs_or_datasets)
@click.option("--png", "png_path", type=click.Path(dir_okay=False),
              help="Dataset: write a picture of the first samples (video: one row of frames per clip; "
                   "audio: log-mel spectrograms).")
@click.option("--samples", type=click.IntRange(min=1, max=64), default=4, show_default=True,
              help="How many samples --png draws.")
@click.option("--force", is_flag=True, help="Replace an existing PNG (nothing else).")
@output_options
def command(path: str, png_path: str | None, samples: int, force: bool, as_json: bool, verbose: int,
            quiet: bool) -> None:
    """Describe a dataset, mask file, embedding set or run.

    \b
    Example:
      jepa info digits-train.zarr --json | python -m json.tool
      jepa info clips.zarr --png clips.png --samples 8
      jepa info tones-train.zarr --png tones.png
    """
    from jepa_cli.data.describe import describe

    description = describe(path)
    if png_path is not None:
        if description["kind"] != "dataset":
            from jepa_cli.errors import InputError

            raise InputError(f"{path}: --png draws a dataset's samples, not a {description['kind']}")
        if description.get("modality") == "audio":
            from jepa_cli.data.pictures import spectrogram_png

            description["png"] = spectrogram_png(path, png_path, samples, force)["png"]
        else:
            from jepa_cli.data.pictures import write_strip_png

            description["png"] = write_strip_png(path, png_path, samples, force)
    emit(description, as_json, _human)


def _human(description: dict[str, Any]) -> None:
    from jepa_cli.data.describe import summarise_long_lists

    flat: dict[str, Any] = {}
    for key, value in description.items():
        if key == "attributes":
            value = summarise_long_lists(value)
        if key in ("label_histogram", "loss_curve"):
            continue
        if isinstance(value, dict) and key != "attributes":
            for sub, sub_value in value.items():
                flat[f"{key}.{sub}"] = sub_value
        else:
            flat[key] = value
    curve = description.get("loss_curve")
    if curve:
        flat["loss"] = (f"{sparkline(curve['loss'])}  {curve['first']:.4f} -> {curve['last']:.4f} "
                        f"(steps {curve['steps'][0]}..{curve['steps'][-1]})")
    print_mapping(flat, title=f"{description['kind']}: {description['path']}")
    histogram = description.get("label_histogram")
    if histogram:
        from rich.table import Table

        table = Table(title="labels")
        table.add_column("class")
        table.add_column("count", justify="right")
        table.add_column("")
        peak = max(histogram.values()) or 1
        for name, count in histogram.items():
            table.add_row(name, str(count), "█" * max(1, round(30 * count / peak)) if count else "")
        stdout_console().print(table)
