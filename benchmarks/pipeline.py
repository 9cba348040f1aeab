"""The input pipeline alone: batches per second that jepa train's DataLoader delivers.

    .venv/bin/python benchmarks/pipeline.py [--batch 32] [--batches 60] [--threads 2] [--json]

The benchmark step's configuration (benchmarks/train_step.py): 64x64x3 uint8 images, the I-JEPA
train transform (random resized crop to 64, flip-free, normalised), batch 32, read from a zarr
dataset written here (2,048 random images), assembled into one global jax.Array per batch exactly
as in training. Reported beside the step's own batches per second when --step-images-per-sec is
given (the target: the pipeline at least 5x the step).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def bench(batch: int, batches: int, threads: int) -> dict:
    import jax

    from jepa_cli.data import store
    from jepa_cli.objectives import make_objective
    from jepa_cli.training import mesh as mesh_lib
    from jepa_cli.training.data import DataLoader

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "images.zarr"
        store.write_group(path, store.base_attributes("dataset", modality="image", layout="NHWC", class_names=[]))
        store.write_array(path / "inputs", np.random.default_rng(0).integers(0, 256, (2048, 64, 64, 3), np.uint8))
        objective = make_objective("ijepa", {"image_size": 64, "patch_size": 8, "channels": 3})
        mesh = mesh_lib.make_mesh("data=-1,fsdp=1")
        loader = DataLoader(path, objective.train_transform(64), batch, 0, mesh_lib.batch_sharding(mesh),
                            num_threads=threads)
        for _ in range(5):  # warm-up: threads started, buffers filled once
            jax.block_until_ready(next(loader))
        start = time.perf_counter()
        for _ in range(batches):
            jax.block_until_ready(next(loader))
        seconds = time.perf_counter() - start
    return {"batch": batch, "threads": threads, "batches_per_sec": batches / seconds,
            "images_per_sec": batches * batch / seconds}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--batches", type=int, default=60)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--step-images-per-sec", type=float, help="the step's images/s, for the ratio")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    out = bench(args.batch, args.batches, args.threads)
    if args.step_images_per_sec:
        out["vs_step"] = out["images_per_sec"] / args.step_images_per_sec
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"pipeline: {out['batches_per_sec']:.1f} batches/s of {args.batch} ({out['images_per_sec']:.0f} images/s, "
          f"{args.threads} threads)" + (f"; {out['vs_step']:.1f}x the step" if "vs_step" in out else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
