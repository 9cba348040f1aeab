"""Benchmark: encode-latents throughput (ViT-tiny, ViT-small at 224 px) and probe seconds.

    .venv/bin/python benchmarks/encode.py [--images 64] [--batch-size 32] [--json]

- matmul: the FLOP/s of a float32 matmul measured in the same process (the utilisation reference).
- encode: `encode_dataset` end to end (read uint8 256x256 images, I-JEPA eval transform: resize +
  centre crop to 224, sharded encoder over all devices, pooled writes) for freshly initialised
  encoders (weights do not change the cost), in images/s from the first finished batch on (so
  without compilation); also the encoder step alone on a ready device batch. FLOPs per image come from XLA's cost analysis of the jitted step;
  utilisation = achieved FLOP/s / matmul FLOP/s.
- probes: seconds for a linear probe (5-value weight-decay grid on a held-out 20 % of TRAIN, then a
  refit) and a k-NN probe (k=20) on 60,000 x 384 TRAIN features and 10,000 TEST features, 10 classes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import matmul_flops  # noqa: E402


def bench_encode(model: str, images: int, batch_size: int, root: Path, peak: float) -> dict:
    import jax

    from jepa_cli.data import store
    from jepa_cli.evaluation.encode import encode_dataset, make_step
    from jepa_cli.objectives import make_objective
    from jepa_cli.training.mesh import make_mesh

    obj = make_objective("ijepa", {"model": model, "patch_size": 16, "image_size": 224, "channels": 3})
    params = obj.init(jax.random.key(0))["encoder"]
    mesh = make_mesh("data=-1,fsdp=1")
    dp = mesh.shape["data"] * mesh.shape["fsdp"]
    batch_size = -(-batch_size // dp) * dp
    src = root / f"src-{model}.zarr"
    if not src.exists():
        store.write_group(src, store.base_attributes("dataset", modality="image", layout="NHWC", class_names=[],
                                                     source="bench", num_samples=images))
        rng = np.random.default_rng(0)
        store.write_array(src / "inputs", rng.integers(0, 256, (images, 256, 256, 3)).astype(np.uint8))

    def fn(p, x):
        return obj.encode(p, x)

    # the step alone: FLOPs from XLA, time after compilation
    step, placed = make_step(fn, params, "mean", mesh)
    x = np.random.default_rng(1).normal(size=(batch_size, 224, 224, 3)).astype(np.float32)
    compiled = step.lower(placed, x).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops_per_image = float(cost.get("flops", 0.0)) / batch_size
    step(placed, x).block_until_ready()
    reps = max(1, images // batch_size)
    t = time.perf_counter()
    for _ in range(reps):
        out = step(placed, x)
    out.block_until_ready()
    step_ips = reps * batch_size / (time.perf_counter() - t)

    # end to end, steady state: from the first finished batch (which includes compilation) to the end
    out_path = root / f"emb-{model}.zarr"
    marks: list[tuple[float, int]] = []
    encode_dataset(src, out_path, fn, params, obj.eval_transform(224), batch_size=batch_size, mesh=mesh, force=True,
                   on_progress=lambda n: marks.append((time.perf_counter(), n)))
    end = time.perf_counter()
    e2e = sum(n for _, n in marks[1:]) / (end - marks[0][0])
    shutil.rmtree(out_path, ignore_errors=True)
    return {
        "model": f"vit-{model}", "images": images, "batch_size": batch_size, "devices": dp,
        "gflop_per_image": round(flops_per_image / 1e9, 3),
        "encode_images_per_s": round(e2e, 2), "step_images_per_s": round(step_ips, 2),
        "utilisation_e2e": round(e2e * flops_per_image / peak, 4),
        "utilisation_step": round(step_ips * flops_per_image / peak, 4),
    }


def bench_probes(n_train: int = 60000, n_test: int = 10000, dim: int = 384, classes: int = 10) -> dict:
    from jepa_cli.evaluation.knn import knn_probe
    from jepa_cli.evaluation.linear import linear_probe

    rng = np.random.default_rng(0)
    centers = 0.1 * rng.normal(size=(classes, dim)).astype(np.float32)  # overlapping classes
    y, yt = rng.integers(0, classes, n_train), rng.integers(0, classes, n_test)
    x = (centers[y] + rng.normal(size=(n_train, dim))).astype(np.float32)
    xt = (centers[yt] + rng.normal(size=(n_test, dim))).astype(np.float32)
    t = time.perf_counter()
    lin = linear_probe(x, y, xt, yt, classes)
    linear_s = time.perf_counter() - t
    t = time.perf_counter()
    knn = knn_probe(x, y, xt, yt, classes, k=20)
    knn_s = time.perf_counter() - t
    return {"features": f"{n_train} x {dim} (test {n_test}, {classes} classes)",
            "linear_seconds": round(linear_s, 2), "linear_top1": round(lin["top1"], 4),
            "linear_weight_decay": lin["weight_decay"],
            "knn_seconds": round(knn_s, 2), "knn_top1": round(knn["top1"], 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--models", default="tiny,small")
    ap.add_argument("--no-probes", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import jax

    device = f"{jax.device_count()} x {jax.devices()[0].device_kind} ({jax.default_backend()})"
    peak = matmul_flops(4096 if jax.default_backend() != "cpu" else 2048)
    result = {"device": device, "matmul_gflops": round(peak / 1e9, 1), "encode": []}
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            result["encode"].append(bench_encode(model, args.images, args.batch_size, Path(tmp), peak))
            if not args.json:
                print(result["encode"][-1], file=sys.stderr)
    if not args.no_probes:
        result["probes"] = bench_probes()
    if args.json:
        print(json.dumps(result))
        return
    print(f"device: {device}; float32 matmul: {result['matmul_gflops']} GFLOP/s")
    print(f"{'model':<10} {'GFLOP/img':>9} {'img/s e2e':>10} {'img/s step':>10} {'util e2e':>9} {'util step':>9}")
    for r in result["encode"]:
        print(f"{r['model']:<10} {r['gflop_per_image']:>9} {r['encode_images_per_s']:>10} {r['step_images_per_s']:>10}"
              f" {r['utilisation_e2e']:>9.1%} {r['utilisation_step']:>9.1%}")
    if "probes" in result:
        p = result["probes"]
        print(f"probes on {p['features']}: linear {p['linear_seconds']} s (top-1 {p['linear_top1']}), "
              f"k-NN {p['knn_seconds']} s (top-1 {p['knn_top1']})")


if __name__ == "__main__":
    main()
