"""`jepa mask`: sample context/target masks; write, show, picture or summarize them."""

from __future__ import annotations

from pathlib import Path

import click

from jepa_cli import options
from jepa_cli.cli.common import SEED, emit, output_options, stderr_log
from jepa_cli.cli.complete import complete_datasets
from jepa_cli.cli.declared import HxW
from jepa_cli.masks.config import MultiBlock3DConfig, MultiBlockConfig, RandomConfig

MASK_CONFIGS = (MultiBlockConfig, MultiBlock3DConfig, RandomConfig)  # each strategy's options, declared once


def _mask_options(func):
    """One option per field of the strategies' configs (masks/config.py): its help (per strategy where
    the strategies differ) and each strategy's default. Values reach config_from_options as given
    (text such as 0.15,0.2), which reads them per strategy and names the option in any error."""
    declared: dict[str, list] = {}
    for config in MASK_CONFIGS:
        for flag in options.flags(config, flagged_only=False):
            declared.setdefault(flag.name, []).append((config.strategy, flag))
    for name, per_strategy in reversed(declared.items()):
        first = per_strategy[0][1]
        help_text = first.help
        for strategy, flag in per_strategy[1:]:
            if flag.help != first.help:
                help_text = f"{help_text.rstrip('.')}; {strategy}: {flag.help}"
        defaults = {strategy: flag.default_text for strategy, flag in per_strategy if flag.default is not None}
        if len(set(defaults.values())) == 1 and len(defaults) == len(per_strategy):
            shown = f"; default {next(iter(defaults.values()))}"
        else:
            shown = "".join(f"; {strategy} {value}" for strategy, value in defaults.items())
        help_text += f" [{'/'.join(strategy for strategy, _ in per_strategy)}{shown}]"
        if first.kind == "bool":
            func = click.option(f"{first.flag}/--no-{first.flag[2:]}", name, default=None, help=help_text)(func)
        else:
            kinds = {flag.kind for _, flag in per_strategy}
            kind = int if kinds == {"int"} else HxW() if kinds == {"size"} else str
            func = click.option(first.flag, name, type=kind, default=None, help=help_text)(func)
    return func


TARGET_COLOURS = ["red", "blue", "magenta", "yellow", "cyan", "bright_red", "bright_blue", "bright_magenta",
                  "dark_orange", "purple", "deep_pink2", "gold1"]
# Without colour (a pipe, a file, NO_COLOR) each target is drawn with its own character, doubled:
# one per block up to MAX_BLOCKS (64), so that no two targets of a sample look alike.
TARGET_CHARS = "123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz+*="


@click.command("mask", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--strategy", type=click.Choice(["multiblock", "multiblock3d", "random"]), default="multiblock",
              show_default=True, help="I-JEPA multi-block, V-JEPA 3D multi-block or Audio-JEPA random masks.")
@click.option("--batch-size", "--batch", "batch", type=click.IntRange(min=1), default=64, show_default=True,
              help="Masks to sample (--batch: the former name).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="PRNG seed.")
@_mask_options
@click.option("-o", "--output", type=click.Path(dir_okay=True, file_okay=False), help="Write a mask file (zarr v3).")
@click.option("--force", is_flag=True, help="Overwrite an existing output.")
@click.option("--show", is_flag=True, help="Draw the first samples in the terminal (targets by colour; by character without colour).")
@click.option("--png", "png_path", type=click.Path(dir_okay=False), help="Write a picture grid of the first samples.")
@click.option("--data", type=click.Path(), shell_complete=complete_datasets, help="Dataset (zarr) whose first samples --png draws under the masks.")
@click.option("--samples", type=click.IntRange(min=1), default=4, show_default=True,
              help="How many samples --show and --png draw.")
@click.option("--stats", is_flag=True, help="Token counts and per-position coverage heat maps.")
@output_options
def command(strategy, batch, seed, output, force, show, png_path, data, samples, stats, as_json, verbose, quiet,
            **mask_options) -> None:
    """Sample JEPA context/target masks; write, show, picture or summarize them.

    \b
    Example:
      jepa mask --strategy multiblock --grid 14x14 --batch-size 64 --seed 0 -o masks.zarr --show --stats
    """
    _check_paths(output, force, png_path, data)
    import jax

    from jepa_cli import masks
    from jepa_cli.data.preview import preview_images
    from jepa_cli.masks.draw import draw_masks
    from jepa_cli.masks.io import write_masks
    from jepa_cli.masks.render import write_png

    config = masks.config_from_options(strategy, **mask_options)
    masks.check_batch(config, batch)
    images = preview_images(data, samples) if data is not None else None
    log = stderr_log(quiet)
    if verbose:
        log(f"sampling {batch} {strategy} masks on {jax.default_backend()}")
    result, context, targets, summary = draw_masks(config, batch, seed)
    if stats:
        result["stats"] = summary
    if output is not None:
        write_masks(output, config, context, targets, seed, force=force, log=stderr_log(quiet))
        result["output"] = str(output)
    if png_path is not None:
        write_png(png_path, config, context, targets, samples, images, force=force)
        result["png"] = str(png_path)
    if show:
        from rich.console import Console

        console = Console(stderr=as_json, soft_wrap=True)
        colour = console.color_system is not None and not console.no_color
        console.print(render_show(config, context, targets, samples, colour))
    emit(result, as_json, lambda res: _print_result(res, summary if stats else None, config))


def _check_paths(output: str | None, force: bool, png_path: str | None, data: str | None) -> None:
    """Every path checked before any work, so that bad input writes nothing: the outputs free (or
    --force), apart from the data they draw, and --data an existing dataset given with --png."""
    from jepa_cli.data import atomic
    from jepa_cli.errors import InputError

    if png_path is None and data is not None:
        raise InputError("--data is only used with --png")
    if output is not None:
        atomic.check_output(output, force, "masks", [data] if data is not None else [])
    if png_path is not None:
        atomic.check_output_file(png_path, force, atomic.PNG_MAGIC, "PNG picture",
                                 [p for p in (data, output) if p is not None])
    if data is not None and not Path(data).exists():
        raise InputError(f"{data}: no such file or directory")


def _print_result(res: dict, summary: dict | None, config) -> None:
    """The masks' description for people; with --stats (`summary`), the token counts of each target
    and the coverage maps below it instead of the one-line counts."""
    from jepa_cli.cli.common import print_mapping

    flat = {k: v for k, v in res.items() if k not in ("stats", "parameters")}
    if summary is not None:  # the statistics below give the token counts, per target too
        del flat["context_tokens"], flat["target_tokens"]
    else:
        flat["context_tokens"] = _fmt_summary(res["context_tokens"])
        flat["target_tokens"] = _fmt_summary(res["target_tokens"])
    print_mapping(flat)
    if summary is not None:
        _print_stats(summary, config)


def _fmt_summary(s: dict) -> str:
    return f"mean {s['mean']:.1f}, min {s['min']}, max {s['max']}"


def _print_stats(summary: dict, config) -> None:
    from rich.console import Console
    from rich.text import Text

    console = Console(soft_wrap=True)
    console.print(Text("context tokens kept: ", style="bold") + Text(_fmt_summary(summary["context_tokens"])))
    for m, s in enumerate(summary["target_tokens_per_row"]):
        console.print(Text(f"target {m + 1} tokens: ", style="bold") + Text(_fmt_summary(s)))
    console.print(Text("official batch-minimum cut: ", style="bold") + Text(str(summary["official_cut"])))
    for name in ("context_coverage", "any_target_coverage"):
        console.print(Text(f"{name.replace('_', ' ')} (fraction of samples per position):", style="bold"))
        console.print(heat_map(summary[name]))


def heat_map(coverage) -> "Text":
    """A coverage map as a shaded character grid with the range; 3D maps show frames side by side."""
    import numpy as np
    from rich.text import Text

    cov = np.asarray(coverage, float)
    frames = cov[None] if cov.ndim == 2 else cov
    shades = " ░▒▓█"
    out = Text()
    for r in range(frames.shape[1]):
        for f in range(frames.shape[0]):
            for v in frames[f, r]:
                level = min(len(shades) - 1, int(v * (len(shades) - 1) + 0.5))
                out.append(shades[level] * 2, style="green")
            out.append(" ")
        out.append("\n")
    out.append(f"min {cov.min():.3f}  mean {cov.mean():.3f}  max {cov.max():.3f}\n", style="dim")
    return out


def render_show(config, context, targets, samples: int, colour: bool = True):
    """Rich renderable: the first samples as grids of two-character cells (context, each target,
    unused) and a legend. With `colour` the targets differ by colour; without it, by character."""
    from rich.console import Group
    from rich.text import Text

    from jepa_cli.masks.render import cell_labels

    H, W = config.grid
    D = config.frames or 1
    parts = []
    legend = Text("legend: ")
    legend.append(*_glyph(-2, colour))
    legend.append(" context  ")
    ntargets = targets.shape[1]
    for m in range(ntargets):
        legend.append(*_glyph(m, colour))
        legend.append(f" target {m + 1}  " if context.ndim == 2 else f" target (pair {m + 1})  ")
    if getattr(config, "allow_overlap", False):
        legend.append(*_glyph(-3, colour))
        legend.append(" context and target  ")
    legend.append(*_glyph(-1, colour))
    legend.append(" unused")
    parts.append(legend)
    n = min(samples, context.shape[0])
    if context.ndim == 2:
        # samples side by side
        labels = [cell_labels(config, context, targets, i)[0][1].reshape(H, W) for i in range(n)]
        header = Text()
        for i in range(n):
            header.append(f"sample {i}".ljust(2 * W + 2), style="bold")
        parts.append(header)
        for r in range(H):
            line = Text()
            for i in range(n):
                for v in labels[i][r]:
                    line.append(*_glyph(int(v), colour))
                line.append("  ")
            parts.append(line)
    else:
        for i in range(n):
            for title, lab in cell_labels(config, context, targets, i):
                lab = lab.reshape(D, H, W)
                parts.append(Text(f"sample {i}, {title} (frames left to right)", style="bold"))
                for r in range(H):
                    line = Text()
                    for f in range(D):
                        for v in lab[f, r]:
                            line.append(*_glyph(int(v), colour))
                        line.append(" ")
                    parts.append(line)
    return Group(*parts)


def _glyph(label: int, colour: bool) -> tuple[str, str]:
    """(two characters, rich style) of a cell label (masks/render.py: cell_labels)."""
    if label == -2:
        return "██", "green"
    if label == -3:
        return "▒▒", "white"
    if label == -1:
        return "··", "grey50"
    if not colour:
        return TARGET_CHARS[label % len(TARGET_CHARS)] * 2, ""
    return "██", TARGET_COLOURS[label % len(TARGET_COLOURS)]
