"""Every benchmark, one table: figure, ours, baseline (measured in the same run), ratio, target.

    make bench [REFERENCE=~/src/ijepa REFERENCE_PYTHON=~/venv-torch/bin/python]
    .venv/bin/python benchmarks/all.py [--reference DIR] [--reference-python PY] [--quick] [--json]

Runs each benchmark script in its own process with --json (train_step, masks, pipeline (both normalisations), compile,
encode, mixer, sample) and collects its headline figures. With --reference (a checkout of facebookresearch/ijepa
and a Python with torch) the step's baseline is the official code itself; otherwise that row
compares with the last recorded official figure (marked *). --quick shortens every measurement
(for a smoke test, not for figures).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _run(script: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, str(HERE / script), *args, "--json"], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"benchmarks/{script} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def collect(args) -> list[dict]:
    rows: list[dict] = []
    step_args = ["--steps", "3" if args.quick else "20"]
    if args.reference:
        step_args += ["--reference", args.reference, "--reference-python", args.reference_python]
    step = _run("train_step.py", *step_args)
    ref = step.get("reference")
    for r in step["rows"]:
        dev = f"{r['devices']} device{'s' if r['devices'] > 1 else ''}"
        if r["mode"] == "official-truncation":
            base = ref["images_per_sec"] if ref else r["images_per_sec"] / r["vs_official_images_per_sec"]
            rows.append({"figure": f"I-JEPA step, official cut, img/s ({dev})", "ours": r["images_per_sec"],
                         "baseline": base, "baseline_name": "official PyTorch" + ("" if ref else " *"),
                         "ratio": r["images_per_sec"] / base, "target": ">= 1.5x", "met": r["images_per_sec"] / base >= 1.5})
        else:
            rows.append({"figure": f"I-JEPA step, default, FLOP/s ({dev})", "ours": r["achieved_flops"] / 1e9,
                         "baseline": r["matmul_flops"] / 1e9, "baseline_name": "matmul GFLOP/s",
                         "ratio": r["utilisation"], "target": ">= 0.65", "met": r["utilisation"] >= 0.65})
    step_images = max(r["images_per_sec"] for r in step["rows"])
    masks = _run("masks.py", "--repeats", "5" if args.quick else "40")
    for r in masks["rows"]:
        if r["sampler"].startswith("ours ("):
            target = 20.0 if r["case"].startswith("multiblock3d") else None
            rows.append({"figure": f"{r['case']} masks/s", "ours": r["masks_per_sec"],
                         "baseline": r["masks_per_sec"] / r["vs_reference"], "baseline_name": "NumPy official",
                         "ratio": r["vs_reference"], "target": f">= {target:g}x" if target else "-",
                         "met": r["vs_reference"] >= target if target else None})
    pipe = _run("pipeline.py", "--batches", "10" if args.quick else "60", "--step-images-per-sec", str(step_images))
    rows.append({"figure": "input pipeline img/s (batch 32)", "ours": pipe["images_per_sec"], "baseline": step_images,
                 "baseline_name": "the step's img/s", "ratio": pipe["vs_step"], "target": ">= 5x",
                 "met": pipe["vs_step"] >= 5})
    device = pipe["device_normalise"]
    rows.append({"figure": "input pipeline img/s, --device-normalise", "ours": device["images_per_sec"],
                 "baseline": pipe["images_per_sec"], "baseline_name": "normalised in the pipeline",
                 "ratio": device["vs_pipeline"], "target": "-", "met": None})
    comp = _run("compile.py", *(["--model", "tiny", "--image-size", "64", "--patch-size", "8"] if args.quick else []))
    rows.append({"figure": f"first step ViT-{comp['model']} --scan-layers, s (cold cache)", "ours": comp["scan_cold_s"],
                 "baseline": comp["unrolled_cold_s"], "baseline_name": "unrolled, cold s",
                 "ratio": comp["scan_vs_unrolled_cold"], "target": "cold < 30 s", "met": comp["scan_cold_s"] < 30})
    rows.append({"figure": f"first step ViT-{comp['model']} --scan-layers, s (warm cache)", "ours": comp["scan_warm_s"],
                 "baseline": comp["scan_cold_s"], "baseline_name": "cold cache s",
                 "ratio": comp["scan_cold_s"] / comp["scan_warm_s"], "target": "a few s", "met": None})
    enc = _run("encode.py", "--models", "tiny", "--no-probes", "--images", "64" if args.quick else "128")
    for r in enc["encode"]:
        rows.append({"figure": f"encode-latents {r['model']} img/s (224 px)", "ours": r["encode_images_per_s"],
                     "baseline": enc["matmul_gflops"], "baseline_name": "matmul GFLOP/s",
                     "ratio": r["utilisation_e2e"], "target": "-", "met": None})  # ratio: utilisation
    mixer = _run("mixer.py", "--lengths", "64,256" if args.quick else "64,256,1024,4096",
                 "--repeats", "1" if args.quick else "3")
    longest = max(r["tokens"] for r in mixer["rows"])
    at = {r["mixer"]: r for r in mixer["rows"] if r["tokens"] == longest}
    for name in ("s5", "hybrid 3:1"):
        rows.append({"figure": f"{name} blocks fwd+bwd ms, {longest} tokens", "ours": at[name]["ms"],
                     "baseline": at["attn"]["ms"], "baseline_name": "attention ms",
                     "ratio": at[name]["time_vs_attn"], "target": "-", "met": None})
    sample = _run("sample.py", "--repeats", "1" if args.quick else "3")
    rates = sample["sample_images_per_s"]
    rows.append({"figure": f"sampling img/s, {sample['steps']} Euler steps, CFG", "ours": rates["scan_full_guidance"],
                 "baseline": rates["baseline_per_step_loop_full_guidance"], "baseline_name": "per-step loop",
                 "ratio": sample["speedup_scan_vs_loop"], "target": "-", "met": None})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reference", help="a checkout of facebookresearch/ijepa (the step's baseline)")
    p.add_argument("--reference-python", default=sys.executable, help="a Python with torch")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    rows = collect(args)
    if args.json:
        print(json.dumps({"rows": rows}))
        return 0
    print(f"| {'figure':<44} | {'ours':>9} | {'baseline':>9} | {'baseline is':<18} | {'ratio':>6} | {'target':<12} | met |")
    print(f"|{'-' * 46}|{'-' * 11}|{'-' * 11}|{'-' * 20}|{'-' * 8}|{'-' * 14}|-----|")
    for r in rows:
        met = {True: "yes", False: "no", None: "-"}[r["met"]]
        print(f"| {r['figure']:<44} | {r['ours']:9.1f} | {r['baseline']:9.1f} | {r['baseline_name']:<18} | "
              f"{r['ratio']:6.2f} | {r['target']:<12} | {met:<3} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
