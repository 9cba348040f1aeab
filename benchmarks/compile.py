"""Time to the first step: `jepa train --steps 1` from launch to its first metrics row, with a cold and
a warm compilation cache, with the blocks unrolled and under lax.scan (`--scan-layers`).

    .venv/bin/python benchmarks/compile.py [--model base] [--image-size 224] [--patch-size 16] [--json]

Each run is a fresh `jepa train` process on a 16-image dataset written here (batch 2, I-JEPA
defaults otherwise): the first with an empty JEPA_CACHE_DIR (everything compiles), the second with
the cache the first one filled (programs are loaded, not compiled). The first step is done when its
row lands in RUN/metrics.jsonl (polled every 20 ms), before the final checkpoint is written; the
process's whole wall time is reported beside it. Target: the cold first step under 30 s
for ViT-B on CPU; the warm one a few seconds. The unrolled cold time is the baseline.
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


def _first_step(args: list, run: Path, env: dict) -> tuple[float, float]:
    """(seconds to the first metrics row, seconds to exit) of one `jepa` process."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "jepa_cli", *map(str, args)], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = None
    metrics = run / "metrics.jsonl"
    while proc.poll() is None:
        if first is None and metrics.exists() and metrics.stat().st_size > 0:
            first = time.perf_counter() - start
        time.sleep(0.02)
    total = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"jepa {' '.join(map(str, args))}: {proc.stderr.read().strip()}")
    return (first if first is not None else total), total


def bench(model: str, image_size: int, patch_size: int) -> dict:
    out: dict = {"model": model, "image_size": image_size, "patch_size": patch_size}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        images = np.random.default_rng(0).integers(0, 256, (16, image_size, image_size, 3), np.uint8)
        np.save(tmp / "images.npy", images)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
        subprocess.run([sys.executable, "-m", "jepa_cli", "ingest", tmp / "images.npy", tmp / "d.zarr", "-q"],
                       env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        train = ["train", "--data", tmp / "d.zarr", "--model", model, "--batch-size", 2, "--steps", 1,
                 "--patch-size", patch_size, "-q"]
        for layers, flags in (("unrolled", []), ("scan", ["--scan-layers"])):
            env["JEPA_CACHE_DIR"] = str(tmp / f"xla-{layers}")  # each mode starts from an empty cache
            for cache in ("cold", "warm"):
                run = tmp / f"{layers}-{cache}"
                first, total = _first_step([*train, *flags, "--out", run], run, env)
                out[f"{layers}_{cache}_s"], out[f"{layers}_{cache}_total_s"] = first, total
    out["cold_s"], out["warm_s"] = out["scan_cold_s"], out["scan_warm_s"]
    out["scan_vs_unrolled_cold"] = out["unrolled_cold_s"] / out["scan_cold_s"]
    return out


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
    print(f"time to the first step, ViT-{args.model} {args.image_size}px (first metrics row; process exit in brackets)")
    for layers in ("unrolled", "scan"):
        print(f"  {layers:8s} cold cache {out[layers + '_cold_s']:6.1f} s ({out[layers + '_cold_total_s']:.1f})"
              f"   warm cache {out[layers + '_warm_s']:6.1f} s ({out[layers + '_warm_total_s']:.1f})")
    print(f"  scan vs unrolled, cold: {out['scan_vs_unrolled_cold']:.2f}x faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
