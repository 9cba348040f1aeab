"""Masks per second: our jitted samplers vs the per-sample NumPy restatement of the official collators.

    .venv/bin/python benchmarks/masks.py [--batch 128] [--repeats 50] [--json]

Cases: I-JEPA multi-block on a 14x14 grid and V-JEPA 3D multi-block on 8x14x14, batch 128.
"Ours" is `jepa_cli.masks.sample` (jitted, on the default JAX backend, static shapes, the derived
context size K); "ours, official cut" also reproduces the official batch-minimum truncation. The
reference is tests/official_masks.py: the official algorithms, one sample at a time, in NumPy.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import jax  # noqa: E402

from jepa_cli import masks  # noqa: E402
from official_masks import ijepa_collate, vjepa_collate  # noqa: E402


def time_blocks(configs, reference, batch: int, repeats: int) -> list[float]:
    """Median seconds per batch of the reference and of each config, each timed in its own block of
    back-to-back batches (as in a loop that only samples), the reference before and after ours.
    Ours: compiled once, warm, a fresh key per call, waited for with block_until_ready."""
    rng = np.random.default_rng(0)
    keys = jax.random.split(jax.random.PRNGKey(0), repeats + 1)

    def ref_block() -> list[float]:
        out = []
        for _ in range(max(5, repeats // 4)):
            start = time.perf_counter()
            reference(rng)
            out.append(time.perf_counter() - start)
        return out

    reference(rng)
    ref_times = ref_block()
    results = []
    for config in configs:
        jax.block_until_ready(masks.sample(keys[0], config, batch))
        times = []
        for key in keys[1:]:
            start = time.perf_counter()
            jax.block_until_ready(masks.sample(key, config, batch))
            times.append(time.perf_counter() - start)
        results.append(float(np.median(times)))
    ref_times += ref_block()
    return [float(np.median(ref_times))] + results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = parser.parse_args()
    B, n = args.batch, args.repeats

    mb = masks.MultiBlockConfig(grid=(14, 14))
    mb3 = masks.MultiBlock3DConfig(grid=(14, 14), frames=8)
    cases = [
        ("multiblock 14x14", mb, lambda rng: ijepa_collate(rng, B, grid=(14, 14))),
        ("multiblock3d 8x14x14", mb3, lambda rng: vjepa_collate(rng, B, frames=8, grid=(14, 14))),
    ]
    rows = []
    for name, config, reference in cases:
        official = dataclasses.replace(config, official_truncation=True)
        ref, ours, cut = time_blocks([config, official], reference, B, n)
        for label, seconds in (("NumPy reference", ref), (f"ours (K={masks.context_slots(config)})", ours),
                               ("ours, official cut", cut)):
            rows.append({"case": name, "sampler": label, "ms_per_batch": seconds * 1e3,
                         "masks_per_sec": B / seconds, "vs_reference": ref / seconds})
    if args.json:
        print(json.dumps({"backend": jax.default_backend(), "batch": B, "repeats": n, "rows": rows}))
        return
    print(f"backend: {jax.default_backend()} ({jax.devices()[0].device_kind}), batch {B}, "
          f"median of {n} batches, {os.cpu_count()} CPUs")
    header = f"| {'case':<22} | {'sampler':<19} | {'ms/batch':>9} | {'masks/s':>10} | {'vs reference':>12} |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for r in rows:
        print(f"| {r['case']:<22} | {r['sampler']:<19} | {r['ms_per_batch']:9.3f} | {r['masks_per_sec']:10,.0f} | "
              f"{r['vs_reference']:11.1f}x |")


if __name__ == "__main__":
    main()
