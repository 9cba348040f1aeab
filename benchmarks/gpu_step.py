"""One I-JEPA train step at a given model size, dtype and batch on the default JAX device.

    .venv/bin/python benchmarks/gpu_step.py --model base --patch-size 16 --image-size 224 \
        --dtype bfloat16 --batch auto [--steps 10] [--json]

Used by benchmarks/gpu.sh (one process per configuration, so an out-of-memory batch or a crash
costs only its own row). Prints images/s, the analytic model FLOPs per step, and the model FLOP
utilisation (MFU) against the chip's peak for the dtype, read from PEAK_TFLOPS by device name.

`--batch auto`: the step is compiled once at a probe batch (its compiled memory is measured, XLA's
memory analysis), the largest batch predicted to fit in 85 % of the device's memory limit is taken,
rounded down to a power of two, and halved on an out-of-memory error until it runs. Where the
backend reports no memory limit (the CPU), `--batch auto` means the probe batch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_step import bench  # noqa: E402

# Dense (no sparsity) tensor-core peak TFLOP/s by device-name fragment, from NVIDIA's and Google's
# datasheets; the first fragment found in the device kind wins, so longer names come first.
PEAK_TFLOPS = {
    # name fragment: (bfloat16, float32 -- TF32 tensor cores where XLA uses them by default)
    "H200": (989.0, 494.0),
    "H100 PCIe": (756.0, 378.0),
    "H100": (989.0, 494.0),  # SXM
    "GH200": (989.0, 494.0),
    "A100": (312.0, 156.0),
    "L40S": (362.0, 183.0),
    "L4": (121.0, 60.0),
    "A10G": (70.0, 35.0),
    "A10": (125.0, 62.5),
    "RTX 4090": (165.0, 82.6),
    "TPU v4": (275.0, 275.0),
    "TPU v5 lite": (197.0, 197.0),
    "TPU v5e": (197.0, 197.0),
    "TPU v5p": (459.0, 459.0),
    "TPU v6": (918.0, 918.0),
}
HEADROOM = 0.85  # leave 15 % of the device's memory for XLA's own buffers and fragmentation


def peak_flops(device_kind: str, dtype: str) -> float | None:
    """The chip's dense peak FLOP/s for `dtype`, or None for a chip not in the table (the CPU)."""
    for fragment, (bf16, f32) in PEAK_TFLOPS.items():
        if fragment.lower() in device_kind.lower():
            return 1e12 * (bf16 if dtype == "bfloat16" else f32)
    return None


def memory_limit() -> int | None:
    """Bytes the default device may allocate, or None where the backend does not say."""
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("bytes_limit")


def fitting_batch(probe: dict, probe_batch: int, limit: int) -> int:
    """The largest power-of-two batch whose predicted memory fits HEADROOM x `limit`: arguments
    (the state) fixed, temporaries and the batch's input linear in the batch."""
    m = probe["memory"]
    fixed = m["argument"]
    per_example = max(1.0, m["temp"] / probe_batch)
    batch = probe_batch
    while fixed + per_example * batch * 2 <= HEADROOM * limit and batch < 65536:
        batch *= 2
    return batch


def is_out_of_memory(exc: Exception) -> bool:
    text = str(exc)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


def run(args) -> dict:
    options = dict(model=args.model, patch_size=args.patch_size, image_size=args.image_size, channels=3,
                   pred_depth=args.pred_depth, pred_width=args.pred_width, dtype=args.dtype,
                   min_keep=args.min_keep, scan_layers=args.scan_layers, width=args.width, depth=args.depth,
                   heads=args.heads, remat=args.remat, attention_impl=args.attention_impl)
    limit = memory_limit()
    if args.batch == "auto" and limit:
        probe = bench(False, 1, args.probe_batch, options)
        batch = fitting_batch(probe, args.probe_batch, limit) if probe["memory"] else args.probe_batch
    elif args.batch == "auto":  # no memory limit to fill (the CPU)
        batch = args.probe_batch
    else:
        batch = int(args.batch)
    while True:
        try:
            row = bench(False, args.steps, batch, options)
            break
        except Exception as exc:  # an out-of-memory batch is halved; anything else is a real failure
            if not is_out_of_memory(exc) or batch <= 1:
                raise
            batch //= 2
    device = jax.devices()[0]
    peak = peak_flops(device.device_kind, args.dtype)
    row.update(model=args.model, remat=args.remat, attention_impl=args.attention_impl, patch_size=args.patch_size, image_size=args.image_size, dtype=args.dtype,
               batch=batch, device_kind=device.device_kind, backend=jax.default_backend(),
               memory_limit=limit, peak_flops=peak,
               mfu=row["analytic_flops"] / peak if peak else None)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="base")
    p.add_argument("--patch-size", type=int, default=16)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--width", type=int, help="override the model size's width (tiny smoke tests)")
    p.add_argument("--depth", type=int, help="override the model size's depth")
    p.add_argument("--heads", type=int, help="override the model size's heads")
    p.add_argument("--pred-depth", type=int, default=12)  # in1k_vith14: pred_depth 12
    p.add_argument("--pred-width", type=int, default=384)  # in1k_vith14: pred_emb_dim 384
    p.add_argument("--min-keep", type=int, default=10)  # in1k_vith14: min_keep 10
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    p.add_argument("--batch", default="auto", help="an integer, or auto: the largest that fits")
    p.add_argument("--probe-batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--remat", choices=("none", "dots", "block"), default="none")
    p.add_argument("--attention-impl", choices=("xla", "dot_product"), default="xla")
    p.add_argument("--scan-layers", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    row = run(args)
    if args.json:
        print(json.dumps(row))
    else:
        mfu = f"{100 * row['mfu']:.1f} %" if row["mfu"] is not None else "n/a (chip not in the table)"
        print(f"{row['device_kind']} {args.model}/{args.patch_size} {args.image_size}px {args.dtype} "
              f"batch {row['batch']}: {row['images_per_sec']:.1f} img/s, MFU {mfu}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
