"""Time to the first step: `jepa train --steps 1` end to end, with a cold and a warm compilation cache.

    .venv/bin/python benchmarks/compile.py [--model base] [--image-size 224] [--patch-size 16] [--json]

Each run is a fresh `jepa train` process on a 16-image dataset written here (batch 2, I-JEPA
defaults otherwise): the first with an empty JEPA_CACHE_DIR (everything compiles), the second with
the cache the first one filled (the step is loaded, not compiled). Reports both wall times and
their ratio. Target (issue 9): the cold first step under 30 s for ViT-B on CPU; the warm one a
few seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _jepa(args: list, env: dict) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "jepa_cli", *map(str, args)], env=env, cwd=ROOT,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"jepa {' '.join(map(str, args))}: {done.stderr.strip()}")
    return time.perf_counter() - start


def bench(model: str, image_size: int, patch_size: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        images = np.random.default_rng(0).integers(0, 256, (16, image_size, image_size, 3), np.uint8)
        np.save(tmp / "images.npy", images)
        env = {**os.environ, "JEPA_CACHE_DIR": str(tmp / "xla"), "PYTHONPATH": str(ROOT)}
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
        _jepa(["ingest", tmp / "images.npy", tmp / "d.zarr", "-q"], env)
        train = ["train", "--data", tmp / "d.zarr", "--model", model, "--batch-size", 2, "--steps", 1,
                 "--patch-size", patch_size, "-q"]
        cold = _jepa([*train, "--out", tmp / "cold"], env)
        warm = _jepa([*train, "--out", tmp / "warm"], env)
    return {"model": model, "image_size": image_size, "patch_size": patch_size, "cold_s": cold, "warm_s": warm, "cold_over_warm": cold / warm}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="base")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--patch-size", type=int, default=16)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    out = bench(args.model, args.image_size, args.patch_size)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"time to the first step, ViT-{args.model} {args.image_size}px: cold cache {out['cold_s']:.1f} s, "
          f"warm cache {out['warm_s']:.1f} s ({out['cold_over_warm']:.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
