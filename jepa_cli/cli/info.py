"""`jepa info PATH`."""

from __future__ import annotations

from typing import Any

import click

from jepa_cli.cli.common import emit, output_options, print_mapping


@click.command("info")
@click.argument("path", type=click.Path())
@output_options
def command(path: str, as_json: bool, verbose: int, quiet: bool) -> None:
    """Describe a dataset, mask file, embedding set or run.

    \b
    Example:
      jepa info digits-train.zarr --json | python -m json.tool
    """
    from jepa_cli.data.describe import describe

    emit(describe(path), as_json, _human)


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
