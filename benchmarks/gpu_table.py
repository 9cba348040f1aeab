"""benchmarks/gpu.sh's table: one markdown row per JSON line that gpu_step.py or the official step wrote.

    python benchmarks/gpu_table.py ROWS.jsonl > TABLE.md
"""

from __future__ import annotations

import json
import sys

# gpu_step.py's options that a row names in its label where it departs from this default
LEVER_DEFAULTS = {"attention_impl": "xla", "remat": "none"}


def table(rows: list[dict]) -> str:
    device = next((r["device_kind"] for r in rows if "device_kind" in r), "unknown device")
    lines = [f"# I-JEPA step on {device}", "",
             "| step | dtype | batch | img/s | step ms | TFLOP/s (model) | MFU | memory GiB (args + temp) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['label']} | - | - | failed: {r['error'].splitlines()[-1][:120]} | | | | |")
        elif r.get("official"):
            dtype = "bf16 autocast" if r.get("bf16") else "float32"
            lines.append(f"| official PyTorch {r['model']} | {dtype} | {r['batch']} | {r['images_per_sec']:.1f} | "
                         f"{r['step_ms']:.1f} | | | |")
        else:
            mfu = f"{100 * r['mfu']:.1f} %" if r.get("mfu") is not None else "n/a"
            mem = r.get("memory") or {}
            gib = (mem.get("argument", 0) + mem.get("temp", 0)) / 2**30 if mem else float("nan")
            levers = "".join(f", {name} {r[name]}" for name, plain in LEVER_DEFAULTS.items() if r.get(name, plain) != plain)
            lines.append(f"| ours {r['model']}/{r['patch_size']} {r['image_size']}px{levers} | {r['dtype']} | {r['batch']} | "
                         f"{r['images_per_sec']:.1f} | {r['step_ms']:.1f} | {r['analytic_flops'] / 1e12:.2f} | "
                         f"{mfu} | {gib:.2f} |")
    lines += ["", "MFU: analytic matmul FLOPs of the step (benchmarks/train_step.py analytic_flops) per second over "
              "the chip's dense peak for the dtype (benchmarks/gpu_step.py PEAK_TFLOPS)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    path = (argv or sys.argv[1:])[0]
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    sys.stdout.write(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
