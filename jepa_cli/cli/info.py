"""`jepa info PATH`."""

from __future__ import annotations

from typing import Any

import click

from jepa_cli.cli.common import emit, output_options, print_mapping


@click.command("info")
@click.argument("path", type=click.Path())
@click.option("--png", "png_path", type=click.Path(dir_okay=False),
              help="Audio datasets: draw the log-mel spectrograms of the first clips into this PNG file.")
@click.option("--samples", type=click.IntRange(min=1, max=64), default=4, show_default=True,
              help="How many clips --png draws.")
@click.option("--force", is_flag=True, help="Let --png replace an existing PNG file.")
@output_options
def command(path: str, png_path: str | None, samples: int, force: bool, as_json: bool, verbose: int,
            quiet: bool) -> None:
    """Describe a dataset, mask file, embedding set or run.

    \b
    Example:
      jepa info digits-train.zarr --json | python -m json.tool
      jepa info tones-train.zarr --png tones.png
    """
    from jepa_cli.data.describe import describe

    description = describe(path)
    if png_path is not None:
        from jepa_cli.data.audio import spectrogram_png

        description["png"] = spectrogram_png(path, png_path, samples, force)["png"]
    emit(description, as_json, _human)


def _human(description: dict[str, Any]) -> None:
    flat: dict[str, Any] = {}
    for key, value in description.items():
        if key == "label_histogram":
            continue
        if isinstance(value, dict) and key != "attributes":
            for sub, sub_value in value.items():
                flat[f"{key}.{sub}"] = sub_value
        else:
            flat[key] = value
    print_mapping(flat, title=f"{description['kind']}: {description['path']}")
    histogram = description.get("label_histogram")
    if histogram:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="labels")
        table.add_column("class")
        table.add_column("count", justify="right")
        table.add_column("")
        peak = max(histogram.values()) or 1
        for name, count in histogram.items():
            table.add_row(name, str(count), "█" * max(1, round(30 * count / peak)) if count else "")
        Console().print(table)
