"""The input pipeline alone: batches per second that jepa train's DataLoader delivers.

    .venv/bin/python benchmarks/pipeline.py [--batch 32] [--batches 60] [--threads 2] [--size 64]
                                            [--source-size 64] [--json]

The benchmark step's configuration (benchmarks/train_step.py): 64x64x3 uint8 images, the I-JEPA
train transform (random resized crop to 64, flip-free, normalised), batch 32, read from a zarr
dataset written here (2,048 random images), assembled into one global jax.Array per batch exactly
as in training. Reported beside the step's own batches per second when --step-images-per-sec is
given (the target: the pipeline at least 5x the step).

Measured twice in the same run: normalised in the pipeline (the default) and with
`--device-normalise` (uint8 pixels to the device, normalised there by the step's first op, timed
here as its own jitted call), with the bytes each batch moves to the device. `--size 224
--source-size 256` is the ImageNet geometry of the GPU recipes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def bench(batch: int, batches: int, threads: int, size: int = 64, source_size: int = 64,
          on_device: bool = False) -> dict:
    import jax

    from jepa_cli.data import store
    from jepa_cli.objectives import make_objective
    from jepa_cli.training import mesh as mesh_lib
    from jepa_cli.training.data import DataLoader

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "images.zarr"
        store.write_group(path, store.base_attributes("dataset", modality="image", layout="NHWC", class_names=[]))
        count = 2048 if source_size <= 64 else 256
        pixels = np.random.default_rng(0).integers(0, 256, (count, source_size, source_size, 3), np.uint8)
        store.write_array(path / "inputs", pixels)
        objective = make_objective("ijepa", {"image_size": size, "patch_size": 8, "channels": 3})
        transform = objective.train_transform(size, on_device=on_device)
        finish = jax.jit(transform.device) if on_device else (lambda b: b)
        mesh = mesh_lib.make_mesh("data=-1,fsdp=1")
        loader = DataLoader(path, transform, batch, 0, mesh_lib.batch_sharding(mesh), num_threads=threads)
        for _ in range(5):  # warm-up: threads started, buffers filled once, the normalisation compiled
            jax.block_until_ready(finish(next(loader)))
        start = time.perf_counter()
        for _ in range(batches):
            moved = next(loader)
            jax.block_until_ready(finish(moved))
        seconds = time.perf_counter() - start
    return {"batch": batch, "threads": threads, "size": size, "batches_per_sec": batches / seconds,
            "images_per_sec": batches * batch / seconds, "bytes_per_batch": int(moved["image"].nbytes)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--batches", type=int, default=60)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--size", type=int, default=64, help="the crop's side in pixels")
    p.add_argument("--source-size", type=int, default=64, help="the stored images' side in pixels")
    p.add_argument("--step-images-per-sec", type=float, help="the step's images/s, for the ratio")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    out = bench(args.batch, args.batches, args.threads, args.size, args.source_size)
    device = bench(args.batch, args.batches, args.threads, args.size, args.source_size, on_device=True)
    out["device_normalise"] = {**device, "vs_pipeline": device["images_per_sec"] / out["images_per_sec"]}
    if args.step_images_per_sec:
        out["vs_step"] = out["images_per_sec"] / args.step_images_per_sec
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"| normalised | images/s ({args.batch} x {args.size}px, {args.threads} threads) | MB per batch | ratio |")
    print("|---|---|---|---|")
    for name, row, ratio in (("in the pipeline (baseline)", out, 1.0),
                             ("on the device", device, out["device_normalise"]["vs_pipeline"])):
        print(f"| {name} | {row['images_per_sec']:.0f} | {row['bytes_per_batch'] / 1e6:.2f} | {ratio:.2f} |")
    if "vs_step" in out:
        print(f"the pipeline is {out['vs_step']:.1f}x the step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
