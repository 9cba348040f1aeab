"""Benchmark one I-JEPA train step (the trainer's jitted step) on this machine.

ViT-tiny, 64x64x3 inputs, patch 8, batch 32, predictor depth 6 width 96, the default masks,
float32. Reports images/s, achieved FLOP/s (XLA's cost analysis of the compiled step), the
machine's float32 matmul FLOP/s measured in the same run, their ratio (utilisation), and the
context and target tokens per sample, in the default mode and with --official-truncation.

    .venv/bin/python benchmarks/train_step.py [--steps 20] [--mode both|default|official] [--json]
                                              [--cpu-devices N] [--reference DIR [--reference-python PY]]

The step runs as `jepa train` runs it: sharded over a `data` mesh of every device. On a CPU-only
machine it is measured twice, each in its own process: as one device, and split into one device
per core (`--cpu-devices N`, XLA's --xla_force_host_platform_device_count), which is how
`jepa train --cpu-devices N` spreads a batch over the cores.

Baseline: the official PyTorch code itself, measured in the same run when `--reference DIR` names a
checkout of facebookresearch/ijepa (52c1ae95) and a Python with torch is at hand (`--reference-python`,
default this one; `pip install torch==2.13.0`, the `bench` extra): benchmarks/official_ijepa_step.py
drives its init_model / init_opt / MaskCollator and train-step body on the same configuration and
threads. Without it the ratio column shows the last recorded figure (74-84 images/s, marked *).
Targets: official truncation >= 1.5x its images/s; default mode >= 65 % of the matmul rate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

if "--cpu-devices" in sys.argv:  # must reach XLA before JAX initialises its backend
    _count = sys.argv[sys.argv.index("--cpu-devices") + 1]
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={_count}"

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import matmul_flops  # noqa: E402

RECORDED_REF_IMAGES_PER_SEC = 79.0  # the official step, 74-84 img/s on this 2-core machine (benchmarks/NOTES.md)


def reference_step(directory: str, python: str, steps: int, threads: int, *extra: str) -> dict:
    """The official step's figures, from benchmarks/official_ijepa_step.py under `python` (`extra`:
    more of its options)."""
    script = Path(__file__).resolve().parent / "official_ijepa_step.py"
    cmd = [python, str(script), "--reference", directory, "--steps", str(steps), "--threads", str(threads), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the official step failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def analytic_flops(batch: int, k: int, m: int, t: int, n: int = 64, d: int = 192, depth: int = 12, r: float = 4.0,
                   w: int = 96, pdepth: int = 6, patch_in: int = 8 * 8 * 3) -> float:
    """Matmul FLOPs of one step over the static token slots: target encoder forward on all n tokens,
    context encoder and predictor forward + backward (x3)."""

    def blocks(tokens: int, seqs: int, width: int, layers: int) -> float:
        linear = 2.0 * tokens * seqs * width * width * (4 + 2 * r)
        attn = 4.0 * seqs * tokens * tokens * width
        return layers * (linear + attn)

    target = 2.0 * n * patch_in * d + blocks(n, 1, d, depth)
    context = 2.0 * k * patch_in * d + blocks(k, 1, d, depth)
    pred = 2.0 * k * d * w + blocks(k + t, m, w, pdepth) + 2.0 * m * t * w * d
    return batch * (target + 3.0 * (context + pred))


TINY_STEP = dict(model="tiny", patch_size=8, image_size=64, channels=3, pred_depth=6, pred_width=96,
                 dtype="float32", min_keep=4)  # as official_ijepa_step.py


def compiled_step(official: bool, batch: int = 32, options: dict | None = None):
    """The trainer's jitted I-JEPA step, compiled, as `jepa train` runs it (sharded over a `data` mesh
    of every device): (compiled, state, batch dict, objective, compile seconds). `options` are
    `jepa train --objective ijepa` options (default: the ViT-tiny 64 px benchmark step)."""
    from jepa_cli.objectives import make_objective
    from jepa_cli.training.config import build_config
    from jepa_cli.training.run import build_optimizer
    from jepa_cli.training.state import init_state
    from jepa_cli.training.step import jit_step, make_step_fn
    from jepa_cli.training import mesh as mesh_lib
    from jepa_cli.training.run import abstract_state

    opts = {**(options or TINY_STEP), "official_truncation": official}
    objective = make_objective("ijepa", opts).with_total_updates(1000)
    size = objective.config.image_size
    cfg = build_config({"steps": 1000, "batch_size": batch})
    lengths = {"steps": 1000, "t_max": 1000, "warmup_steps": 100, "ipe": 100}
    abstract = jax.eval_shape(objective.init, jax.ShapeDtypeStruct((2,), np.uint32))
    tx, lr_fn, wd_fn, m_fn = build_optimizer(cfg, objective, lengths, abstract)
    mesh = mesh_lib.make_mesh("data=-1,fsdp=1")
    state_sh = mesh_lib.state_shardings(mesh, abstract_state(objective, tx))
    state = jax.jit(lambda k: init_state(objective, tx, k), out_shardings=state_sh)(jax.random.PRNGKey(0))
    images = jax.device_put(jax.random.normal(jax.random.PRNGKey(3), (batch, size, size, 3), jnp.float32),
                            mesh_lib.batch_sharding(mesh))
    step = jit_step(make_step_fn(objective, tx, lr_fn, wd_fn, m_fn), state_sh, mesh_lib.batch_sharding(mesh),
                    mesh_lib.replicated(mesh))
    t0 = time.perf_counter()
    compiled = step.lower(state, {"image": images}).compile()
    return compiled, state, {"image": images}, objective, time.perf_counter() - t0


def bench(official: bool, steps: int, batch: int = 32, options: dict | None = None) -> dict:
    """One configuration's step: images/s, FLOPs (XLA's count and the analytic one), token counts.
    `options` are `jepa train --objective ijepa` options (default: the ViT-tiny 64 px benchmark step)."""
    compiled, state, inputs, objective, compile_s = compiled_step(official, batch, options)
    images = inputs["image"]
    size = images.shape[1]
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops = float(cost.get("flops", 0.0)) * len(jax.devices()) if cost else 0.0  # cost is per device
    for _ in range(3):  # warm-up
        state, metrics = compiled(state, {"image": images})
    jax.block_until_ready(state)
    ctx, tgt, times = [], [], []
    for _ in range(steps):
        t = time.perf_counter()
        state, metrics = compiled(state, {"image": images})
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t)
        m = jax.device_get(metrics)
        ctx.append(float(m["context_tokens"]))
        tgt.append(float(m["target_tokens"]))
    sec = float(np.median(times))
    masks = objective.sample_masks(jax.random.PRNGKey(0), batch)
    k = masks.context_index.shape[-1]
    m_, t = masks.target_index.shape[-2:]
    mc = objective.config.model_config
    analytic = analytic_flops(batch, k, m_, t, n=(size // mc.patch_size) ** 2, d=mc.embed_dim,
                              depth=mc.encoder_depth, r=mc.encoder_mlp_ratio, w=mc.pred_width,
                              pdepth=mc.pred_depth, patch_in=mc.patch_size**2 * mc.channels)
    return {
        "mode": "official-truncation" if official else "default",
        "devices": len(jax.devices()),
        "images_per_sec": batch / sec,
        "step_ms": 1000 * sec,
        "flops_per_step": flops,
        "achieved_flops": flops / sec,
        "analytic_flops_per_step": analytic,
        "analytic_flops": analytic / sec,
        "slots": {"context": int(k), "targets": int(m_), "target_slots": int(t)},
        "context_tokens": float(np.mean(ctx)),
        "context_tokens_range": [float(np.min(ctx)), float(np.max(ctx))],
        "target_tokens": float(np.mean(tgt)),
        "compile_s": compile_s,
        "memory": memory_bytes(compiled),
    }


def memory_bytes(compiled) -> dict:
    """The compiled step's device memory (XLA's memory analysis): arguments, outputs, temporaries."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # some backends do not implement it
        return {}
    if m is None:
        return {}
    return {"argument": int(m.argument_size_in_bytes), "output": int(m.output_size_in_bytes),
            "temp": int(m.temp_size_in_bytes)}


def measure(args) -> dict:
    """This process's rows: the step on every visible device, with the matmul baseline."""
    peak = matmul_flops()
    modes = {"both": (False, True), "default": (False,), "official": (True,)}[args.mode]
    rows = [bench(official, args.steps) for official in modes]
    peak = max(peak, matmul_flops())  # measured before and after, keep the better
    for r in rows:
        r["matmul_flops"] = peak
        r["utilisation"] = r["achieved_flops"] / peak
        r["analytic_utilisation"] = r["analytic_flops"] / peak
    return {"device": str(jax.devices()[0]), "backend": jax.default_backend(), "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--mode", choices=("both", "default", "official"), default="both")
    p.add_argument("--cpu-devices", type=int, help="split the CPU into N devices (default: 1 and one per core)")
    p.add_argument("--reference", help="a checkout of facebookresearch/ijepa: measure the official step too")
    p.add_argument("--reference-python", default=sys.executable, help="a Python with torch (default: this one)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.cpu_devices is not None or jax.default_backend() != "cpu":
        out = measure(args)
    else:  # one process per device count: XLA reads the count once, at start-up
        out = {"rows": []}
        for count in sorted({1, os.cpu_count() or 1}):
            cmd = [sys.executable, __file__, "--steps", str(args.steps), "--mode", args.mode,
                   "--cpu-devices", str(count), "--json"]
            child = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            out.update({k: v for k, v in child.items() if k != "rows"})
            out["rows"] += child["rows"]
    if args.reference:
        out["reference"] = reference_step(args.reference, args.reference_python, args.steps, os.cpu_count() or 1)
    ref = out.get("reference", {}).get("images_per_sec", RECORDED_REF_IMAGES_PER_SEC)
    for r in out["rows"]:
        r["vs_official_images_per_sec"] = r["images_per_sec"] / ref
    if args.json:
        print(json.dumps(out))
        return 0
    hdr = (f"{'mode':<20} {'dev':>3} {'img/s':>7} {'x ref':>6} {'step ms':>8} {'GFLOP/step':>10} {'GFLOP/s':>8} "
           f"{'matmul GFLOP/s':>14} {'util':>6} {'util(an.)':>9} {'ctx tok':>12} {'tgt tok':>8}")
    print(hdr)
    print("-" * len(hdr))
    for r in out["rows"]:
        lo, hi = r["context_tokens_range"]
        print(f"{r['mode']:<20} {r['devices']:>3} {r['images_per_sec']:7.1f} {r['vs_official_images_per_sec']:6.2f} "
              f"{r['step_ms']:8.1f} {r['flops_per_step'] / 1e9:10.2f} {r['achieved_flops'] / 1e9:8.1f} "
              f"{r['matmul_flops'] / 1e9:14.1f} {100 * r['utilisation']:5.1f}% {100 * r['analytic_utilisation']:8.1f}% "
              f"{r['context_tokens']:5.1f} ({lo:.0f}-{hi:.0f}) {r['target_tokens']:8.1f}")
    if "reference" in out:
        r = out["reference"]
        lo, hi = r["context_tokens_range"]
        print(f"{'official (PyTorch ' + r['torch'] + ')':<20} {'-':>3} {r['images_per_sec']:7.1f} {1.0:6.2f} "
              f"{r['step_ms']:8.1f} {'':>10} {'':>8} {'':>14} {'':>6} {'':>9} {r['context_tokens']:5.1f} ({lo}-{hi})")
    else:
        print(f"* x ref against the recorded official figure ({RECORDED_REF_IMAGES_PER_SEC:g} img/s); "
              "--reference DIR measures it in this run", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
