"""`jepa sample`: a generative run's checkpoint -> a dataset of samples (docs/formats.md)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from jepa_cli.data import atomic, locks, resources, resumable, store
from jepa_cli.data.jsonvalues import json_value
from jepa_cli.data.resumable import partial_path
from jepa_cli.errors import InputError, raise_if_signalled_since, signal_mark
from jepa_cli.objectives import OBJECTIVES
from jepa_cli.objectives.genconfig import MAX_GUIDANCE_SCALE
from jepa_cli.sampling.sampler import (SAMPLERS, check_interval, check_interval_guides, make_sampler, sample_batches,
                                       sampling_batch_size)
from jepa_cli.training.mesh import make_mesh
from jepa_cli.training.run import load_run, params_sha256
from jepa_cli.training.runfiles import read_run

WEIGHTS = ("ema", "online")


def resolve_labels(objective, n: int, classes: list[int] | None, all_classes: bool, run_dir,
                   check_count: Callable[[int], None] = lambda count: None) -> np.ndarray | None:
    """The label of every sample: n per class for --class C... or --classes all; without either,
    n samples cycling over the classes (none for an unconditional model: None). `check_count(N)`
    sees the number of samples before anything of that size is allocated."""
    k = objective.config.num_classes
    if n < 1:
        raise InputError(f"-n must be >= 1, got {n}")
    if (classes or all_classes) and k == 0:
        raise InputError(f"{run_dir}: the model is unconditional (trained without labels); drop --class/--classes")
    if classes and all_classes:
        raise InputError("give --class or --classes all, not both")
    if all_classes:
        classes = list(range(k))
    if classes:
        classes = list(dict.fromkeys(classes))  # a class named twice is sampled once: n per class
        bad = [c for c in classes if not 0 <= c < k]
        if bad:
            raise InputError(f"class {bad[0]} is not one the model knows (0..{k - 1})")
        check_count(n * len(classes))
        return np.repeat(np.asarray(classes, np.int32), n)
    check_count(n)
    if k == 0:
        return None
    return (np.arange(n, dtype=np.int64) % k).astype(np.int32)


def _class_names(record: dict, k: int) -> list[str]:
    data = (record.get("config") or {}).get("data")
    try:
        names = list(store.read_attributes(data).get("class_names") or []) if data else []
    except InputError:
        names = []
    return names if len(names) == k else [str(i) for i in range(k)]


def sample_run(run_dir: str | Path, output: str | Path, *, n: int, classes: list[int] | None = None,
               all_classes: bool = False, guidance_scale: float = 1.0, guidance_interval=None,
               sampler: str = "euler", steps: int = 32, eta: float = 0.0, seed: int = 0, step: int | None = None,
               weights: str = "ema", batch_size: int = 64, mesh: str | None = "data=-1,fsdp=1", force: bool = False,
               png: str | Path | None = None, on_progress: Callable[[int], None] | None = None,
               on_start: Callable[[int, int], None] | None = None,
               on_log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Samples RUN into the dataset `output`; returns a summary. Everything is checked before
    anything is written. `on_start(N, already drawn)` comes once the work is known (a resumed output
    has samples drawn); `on_progress(samples)` after each batch drawn."""
    log = on_log or (lambda message: None)
    mark = signal_mark()
    run_dir = Path(run_dir)
    _check_settings(run_dir, weights, sampler, guidance_scale, batch_size)
    output, png = _check_outputs(run_dir, output, png, force)
    record, name = _generative_record(run_dir)
    _config, objective, host, ckpt_step = load_run(run_dir, step, on_fallback=lambda _s, message: log(message))
    data_dtype = objective.to_data(np.zeros((1, *objective.sample_shape), np.float32)).dtype
    chunk_n = store.chunk_rows(tuple(objective.sample_shape), data_dtype.itemsize)
    mesh_obj = make_mesh(mesh) if mesh else None
    labels = resolve_labels(objective, n, classes, all_classes, run_dir, check_count=lambda count: _check_room(
        output, (count, *objective.sample_shape), data_dtype, chunk_n, sampling_batch_size(count, batch_size, mesh_obj)))
    lo_hi = _check_guidance(objective, run_dir, guidance_scale, guidance_interval, sampler, steps, eta, png)
    params = host["ema"] if weights == "ema" else host["params"]
    y = labels if labels is not None else np.full(n, objective.null_class, np.int32)
    sampling = {"n": n, "classes": sorted(set(labels.tolist())) if labels is not None else None,
                "guidance_scale": guidance_scale,
                "guidance_interval": None if guidance_interval is None else list(lo_hi), "sampler": sampler,
                "steps": steps, "eta": eta, "seed": seed, "weights": weights, "batch_size": batch_size}
    provenance = {"run": str(run_dir.resolve()), "step": ckpt_step, "objective": name,
                  "model": json_value(objective.to_config()), "params_sha256": params_sha256(params)}
    attrs = _dataset_attributes(objective, record, run_dir, len(y), sampling, provenance)
    if guidance_interval is not None and guidance_scale == 1.0:  # c + 0 (c - u): the interval changes nothing
        log(f"--guidance-interval {lo_hi[0]:g},{lo_hi[1]:g} has no effect at --guidance-scale 1 (no guidance); "
            "give a scale other than 1, e.g. --guidance-scale 2")
    data_shape = (len(y), *objective.sample_shape)
    per_batch = sampling_batch_size(len(y), batch_size, mesh_obj)
    job = {"run": provenance["run"], "step": ckpt_step, "params_sha256": provenance["params_sha256"],
           "sampling": sampling, "rows_per_batch": per_batch, "shape": list(data_shape), "dtype": data_dtype.name}

    def draw(batches: list[int]) -> Iterator[tuple[int, np.ndarray]]:
        return sample_batches(objective, params, y, steps=steps, sampler=sampler, eta=eta, scale=guidance_scale,
                              interval=guidance_interval, seed=seed, batch_size=per_batch, mesh=mesh_obj,
                              batches=batches, on_progress=on_progress)

    def refuse_non_finite(i: int) -> InputError:
        return InputError(f"{output}: batch {i} of the samples is not finite (NaN or inf), nothing written; "
                          f"the {weights} weights of {run_dir} step {ckpt_step} or the settings "
                          f"(--guidance-scale {guidance_scale:g}, --eta {eta:g}) diverge")

    resumed = _write_resumably(output, force, job, chunk_n, draw, objective.to_data, refuse_non_finite, labels, attrs,
                               mark, on_start, log)
    if png is not None:  # after the commit: a stopped command leaves no picture without its dataset
        write_grid(png, store.open_array(output / "inputs"), labels, force, names=attrs["class_names"] or None)
    out = {"output": str(output), "num_samples": len(y), "shape": list(data_shape), "samples_resumed": resumed,
           "modality": objective.config.modality, "run": str(run_dir), "step": ckpt_step, **sampling}
    if png is not None:
        out["png"] = str(png)
    return out


def _check_settings(run_dir: Path, weights: str, sampler: str, guidance_scale: float, batch_size: int) -> None:
    """InputError for a missing run directory or a setting out of range, before anything is read."""
    if not run_dir.is_dir():
        raise InputError(f"{run_dir}: no such run directory")
    if weights not in WEIGHTS:
        raise InputError(f"--weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    if sampler not in SAMPLERS:
        raise InputError(f"unknown sampler {sampler!r} (choose from {', '.join(SAMPLERS)})")
    if not 0.0 <= guidance_scale <= MAX_GUIDANCE_SCALE:  # also NaN, which compares false
        raise InputError(f"--guidance-scale must be a number in [0, {MAX_GUIDANCE_SCALE:g}], got {guidance_scale}")
    if batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {batch_size}")


def _check_outputs(run_dir: Path, output: str | Path, png: str | Path | None, force: bool) -> tuple[Path, Path | None]:
    """The dataset's path and the PNG picture's (None: none asked), each free or `force`d, and apart."""
    output = atomic.check_output(output, force, "dataset", [run_dir])
    if png is not None:
        png = Path(png)
        if output.resolve() in (png.resolve(), *png.resolve().parents):  # moving the output in would clash
            raise InputError(f"{png}: --png is or lies in the -o output {output}; give the picture a path of its own")
        png = atomic.check_output_file(png, force, atomic.PNG_MAGIC, "PNG picture", [run_dir])
    return output, png


def _generative_record(run_dir: Path) -> tuple[dict, str]:
    """RUN's run.json and its objective's name; InputError unless that objective is generative."""
    record = read_run(run_dir)
    name = (record.get("config") or {}).get("objective")
    if not (isinstance(name, str) and getattr(OBJECTIVES.get(name), "generative", False)):
        raise InputError(f"{run_dir}: objective {name!r} is not generative; sample a flow or diffusion run")
    return record, name


def _check_guidance(objective, run_dir: Path, guidance_scale: float, guidance_interval, sampler: str, steps: int,
                    eta: float, png: Path | None) -> tuple[float, float]:
    """The guidance interval (lo, hi) the run's schedule gives `guidance_interval`; InputError for
    guidance of an unconditional model, a sampler the schedule lacks, or --png of latent samples."""
    lo_hi = check_interval(objective, guidance_interval)
    if guidance_scale != 1.0 and objective.config.num_classes == 0:
        raise InputError(f"{run_dir}: the model is unconditional; --guidance-scale needs a class-conditional run")
    make_sampler(objective, steps=steps, sampler=sampler, eta=eta)  # refuses a sampler the schedule lacks
    check_interval_guides(objective, steps, guidance_scale, guidance_interval)
    if png is not None and objective.config.modality != "image":
        raise InputError("--png draws image samples; this run samples latents")
    return lo_hi


def _dataset_attributes(objective, record: dict, run_dir: Path, count: int, sampling: dict,
                        provenance: dict) -> dict[str, Any]:
    """The attributes of the samples' dataset: images NHWC; latents ND or NTD with the shift and
    scale that map them back to the encoder's space."""
    c = objective.config
    extra: dict[str, Any] = {}
    if c.modality == "image":
        extra["layout"] = "NHWC"
    else:
        shift, scale = objective.latent_norm()
        extra.update(layout="ND" if len(objective.sample_shape) == 1 else "NTD",
                     latent_shift=[float(v) for v in shift], latent_scale=[float(v) for v in scale])
    return store.base_attributes("dataset", modality=c.modality, class_names=_class_names(record, c.num_classes),
                                 source=f"jepa sample {run_dir}", split=None, num_samples=count,
                                 sampling=sampling, provenance=provenance, **extra)


def _write_resumably(output: Path, force: bool, job: dict, chunk_n: int,
                     draw: Callable[[list[int]], Iterator[tuple[int, np.ndarray]]],
                     to_data: Callable[[np.ndarray], np.ndarray], refuse_non_finite: Callable[[int], InputError],
                     labels: np.ndarray | None, attrs: dict, mark: Any,
                     on_start: Callable[[int, int], None] | None, log: Callable[[str], None]) -> int:
    """Draws the batches `draw` gives into the partial output of `output` and moves it into place;
    returns the samples an earlier, stopped call had drawn. Units of whole batches (batch i always
    holds the same rows and key), at least a chunk's rows, are written and recorded one at a time, so
    a stopped call resumes at the first unit not recorded."""
    count, per_batch = job["shape"][0], job["rows_per_batch"]
    batches = -(-count // per_batch)
    tmp = partial_path(output)
    with locks.resumable_partial(tmp, output):  # one writer per partial output
        layout = resumable.open_partial(tmp, job, {"batches_per_unit": -(-chunk_n // per_batch), "chunk_n": chunk_n},
                                        log)
        per_unit, chunk_n = layout["batches_per_unit"], layout["chunk_n"]
        unit_rows = per_unit * per_batch  # unit u holds rows [u unit_rows, (u + 1) unit_rows)
        units = range(-(-batches // per_unit))
        done = {u for u in units if resumable.read_unit(tmp, u, log) is not None}
        resumed = sum(min(count, (u + 1) * unit_rows) - u * unit_rows for u in done)
        if on_start:
            on_start(count, resumed)
        samples = store.open_array(tmp / "inputs", write=True) if (tmp / "inputs").exists() else \
            store.create_array(tmp / "inputs", tuple(job["shape"]), np.dtype(job["dtype"]), chunk_n=chunk_n)
        parts: list[np.ndarray] = []
        for i, x in draw([i for i in range(batches) if i // per_unit not in done]):
            if not np.isfinite(x).all():  # to_data would store NaN as black pixels: refuse, keep nothing
                shutil.rmtree(tmp, ignore_errors=True)  # a rerun would draw the same values: nothing to resume
                raise refuse_non_finite(i)
            parts.append(to_data(x))
            if i + 1 == batches or (i + 1) % per_unit == 0:  # the unit's last batch: write it, then record it
                first = (i // per_unit) * unit_rows
                block = np.concatenate(parts)
                store.complete(lambda: samples[first:first + len(block)].write(block))
                resumable.mark_unit(tmp, i // per_unit)
                parts = []
                raise_if_signalled_since(mark)  # a signal a callback swallowed: stop at a unit's edge
        if labels is not None:
            store.write_array(tmp / "labels", labels.astype(np.int32))
        store.write_group(tmp, attrs)
        raise_if_signalled_since(mark)  # never commit after a signal, even one a callback swallowed
        resumable.finish(tmp)
        try:
            atomic.move_into_place(tmp, output, force, "dataset")  # never over an output that appeared meanwhile
        except InputError:  # the place was taken: the finished samples, no longer resumable, go
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return resumed


def _check_room(output: str | Path, data_shape: tuple[int, ...], dtype: np.dtype, chunk_n: int,
                batch_size: int) -> None:
    """InputError unless N samples of `data_shape[1:]` (`dtype`) fit on the disk of `output`, at their
    raw size, and the sampling fits in memory: the labels (int32 [N]), a batch in model space
    (float32, x3: the trajectory's state, its update and the converted copy) and a unit of whole
    batches of at least a chunk's rows, twice (its batches and their concatenation)."""
    n, row = data_shape[0], int(np.prod(data_shape[1:]))
    unit_rows = -(-chunk_n // batch_size) * batch_size
    disk = n * row * dtype.itemsize + 4 * n
    memory = 4 * n + 3 * batch_size * row * 4 + 2 * unit_rows * row * dtype.itemsize
    shape = "x".join(map(str, data_shape[1:]))
    resources.check_room(output, disk, memory, f"{n} samples of {shape} {dtype.name}, uncompressed; pass a smaller -n "
                     "or write to another disk", "pass a smaller --batch-size or -n")


def rows_by_class(labels: np.ndarray | None, n: int, per_class: int) -> list[tuple[int | None, np.ndarray]]:
    """(class, indices of its first `per_class` samples) for each class present, in class order;
    unlabelled samples: one group (None, the first `per_class` indices of n)."""
    if labels is None:
        return [(None, np.arange(min(per_class, n)))]
    return [(int(k), np.flatnonzero(labels == k)[:per_class]) for k in np.unique(labels)]


def class_label(k: int, names: list[str] | None, width: int = 16) -> str:
    """A class as drawn next to its samples: its id, then its name when it has one of its own
    (cut to `width` characters)."""
    name = names[k] if names is not None and 0 <= k < len(names) else str(k)
    return str(k) if name == str(k) else f"{k} {name[:width]}"


LABEL_PAD = 6  # pixels of white around a row's class label in the PNG grid


def grid_picture(images: np.ndarray, labels: np.ndarray | None, per_row: int = 10, cell: int = 32,
                 names: list[str] | None = None) -> np.ndarray:
    """uint8 [H, W, 3]: one row per class (its first `per_row` samples), the class (id and name, see
    class_label) written at the row's left; unlabelled: one row of the first samples, no label column.
    Each tile is `cell` pixels square with a 2-pixel white border."""
    from PIL import Image, ImageDraw, ImageFont

    groups = rows_by_class(labels, len(images), per_row)
    rows = []
    for _k, idx in groups:
        tiles = []
        for i in idx:
            img = images[i]
            img = np.repeat(img, 3, axis=-1) if img.shape[-1] == 1 else img
            tiles.append(np.asarray(Image.fromarray(img).resize((cell, cell), Image.NEAREST)))
        while len(tiles) < per_row:
            tiles.append(np.full((cell, cell, 3), 255, np.uint8))
        rows.append(np.concatenate([np.pad(t, ((2, 2), (2, 2), (0, 0)), constant_values=255) for t in tiles], axis=1))
    grid = np.concatenate(rows, axis=0)
    if labels is None:
        return grid
    font = ImageFont.load_default()
    texts = [class_label(k, names) for k, _ in groups]
    width = int(max(font.getlength(t) for t in texts)) + 2 * LABEL_PAD
    column = Image.new("RGB", (width, grid.shape[0]), (255, 255, 255))
    draw = ImageDraw.Draw(column)
    row_h = cell + 4
    for r, text in enumerate(texts):
        draw.text((LABEL_PAD, r * row_h + row_h // 2), text, fill=(0, 0, 0), font=font, anchor="lm")
    return np.concatenate([np.asarray(column), grid], axis=1)


def write_grid(path, samples, labels: np.ndarray | None, force: bool, per_row: int = 10,
               names: list[str] | None = None) -> None:
    """A PNG grid of image samples, one row per class with its label (grid_picture; written
    atomically, atomic.write_file). `samples`: the written [N, H, W, C] array (TensorStore); only the
    rows the grid shows are read."""
    from PIL import Image

    shown = np.sort(np.concatenate([idx for _k, idx in rows_by_class(labels, int(samples.shape[0]), per_row)]))
    data = np.stack([store.read(samples, slice(int(i), int(i) + 1))[0] for i in shown])
    if data.dtype != np.uint8 or data.ndim != 4:
        raise InputError("--png draws image samples; this run samples latents")
    buffer = io.BytesIO()
    picture = grid_picture(data, None if labels is None else labels[shown], per_row, names=names)
    Image.fromarray(picture).save(buffer, format="PNG")
    atomic.write_file(path, buffer.getvalue(), force, atomic.PNG_MAGIC, "PNG picture")


SHADES = " .:-=+*#%@"  # dark to bright, one character per tenth of the 0..255 range
PREVIEW_PIXELS = 32  # a tile wider or taller than this is drawn from every k-th pixel


def ascii_tile(image: np.ndarray) -> list[str]:
    """An [H, W, C] uint8 image as lines of shaded characters, two per pixel (a terminal cell is
    about twice as tall as wide), every k-th pixel of an image beyond PREVIEW_PIXELS."""
    step = -(-max(image.shape[:2]) // PREVIEW_PIXELS)
    img = image[::step, ::step].astype(np.float32).mean(axis=-1)
    return ["".join(SHADES[int(v / 256 * len(SHADES))] * 2 for v in row) for row in img]


def ascii_preview(data: np.ndarray, groups: list[tuple[int | None, np.ndarray]],
                  names: list[str] | None = None) -> str:
    """Image samples as shaded characters, one block per class: a header naming the class and the
    samples' indices, then its samples side by side. `data` holds the rows of every group, in order."""
    blocks, at = [], 0
    for k, idx in groups:
        tiles = [ascii_tile(data[at + j]) for j in range(len(idx))]
        at += len(idx)
        head = ("" if k is None else f"class {class_label(k, names)}: ") + \
            ("sample " if len(idx) == 1 else "samples ") + ", ".join(str(int(i)) for i in idx)
        lines = ["  ".join(parts) for parts in zip(*tiles)]
        blocks.append("\n".join([head, *lines]))
    return "\n\n".join(blocks)


def preview(output: str | Path, per_class: int = 4, max_classes: int = 10) -> str:
    """`jepa sample --show`: the first `per_class` samples of each class of an image sample dataset
    (at most `max_classes` classes, then a line saying how many more there are), read back from
    `output`; only the rows shown are read."""
    output = Path(output)
    attrs = store.read_attributes(output)
    inputs = store.open_array(output / "inputs")
    labels = store.read_array(output / "labels") if (output / "labels").exists() else None
    groups = rows_by_class(labels, int(inputs.shape[0]), per_class)
    more = len(groups) - max_classes
    groups = groups[:max_classes]
    data = [store.read(inputs, slice(int(i), int(i) + 1))[0] for _k, idx in groups for i in idx]
    names = attrs.get("class_names") or None
    text = ascii_preview(np.stack(data), groups, names)
    if more > 0:
        text += f"\n\n({more} more classes not shown; --png draws every class)"
    return text
