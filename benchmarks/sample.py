"""Benchmark: sampling images/s at 32 steps (the flow-digits-tiny DiT, random weights) and the flow
train step's images/s, each with its baseline measured in the same run.

    .venv/bin/python benchmarks/sample.py [--batch-size 64] [--steps 32] [--json]

- scan: `jepa sample`'s path: the whole 32-step trajectory of a batch in one jit (lax.scan), with
  full-trajectory classifier-free guidance (two network passes a step) and with guidance in an
  interval (t in (0.2, 0.8]: the unconditional pass is skipped outside it).
- baseline: the same Euler steps from a Python loop, one jitted network call per step (a host round
  trip per step), full guidance.
- train: the jitted flow train step (loss, AdamW, whole-tree EMA) on a device batch, against the
  matmul FLOP/s of the machine (benchmarks/machine.py) as the utilisation reference.
Times exclude compilation (the first call), best of `--repeats`. Prints a table of images/s with
each sampler's ratio to the per-step loop (`--json`: one object, as benchmarks/all.py reads it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import matmul_flops  # noqa: E402

RECIPE = dict(width=64, depth=4, heads=4, patch_size=4, image_size=16, channels=1, num_classes=10)


def best_time(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import optax

    from jepa_cli.objectives import make_objective
    from jepa_cli.sampling.sampler import guide, make_sampler
    from jepa_cli.training.state import init_state
    from jepa_cli.training.step import make_step_fn

    obj = make_objective("flow", RECIPE)
    params = obj.init(jax.random.key(0))
    b, k = args.batch_size, args.steps
    labels = jnp.arange(b, dtype=jnp.int32) % 10
    key = jax.random.key(1)
    def scan(scale, interval):
        fn = jax.jit(make_sampler(obj, steps=k, sampler="euler", scale=scale, interval=interval))
        return best_time(lambda: fn(params, key, labels).block_until_ready(), args.repeats)

    scan_full, scan_interval, scan_plain = scan(2.0, None), scan(2.0, (0.2, 0.8)), scan(1.0, None)

    times = obj.sampling_times(k)
    null = jnp.full_like(labels, obj.null_class)

    @jax.jit
    def one_step(p, x, t, t_next):
        tb = jnp.full((b,), t)
        v = guide(obj.predict(p, x, tb, labels), obj.predict(p, x, tb, null), 2.0)
        return x + (t_next - t) * v

    def loop():
        x = obj.prior(key, (b, *obj.sample_shape))
        for i in range(k):
            x = one_step(params, x, float(times[i]), float(times[i + 1]))
        return x.block_until_ready()

    baseline = best_time(loop, args.repeats)

    tx = optax.adamw(1e-3, weight_decay=0.0)
    state = init_state(obj, tx, jax.random.PRNGKey(0))
    step = jax.jit(make_step_fn(obj, tx, lambda s: 1e-3, lambda s: 0.0, obj.ema_spec.momentum))
    batch = {"image": jax.random.normal(key, (b, 16, 16, 1)), "label": labels}
    compiled = step.lower(state, batch).compile()
    flops = (compiled.cost_analysis() or {}).get("flops") if hasattr(compiled, "cost_analysis") else None
    if isinstance(flops, list):
        flops = flops[0].get("flops")
    holder = {"s": state}

    def train():
        holder["s"], m = step(holder["s"], batch)
        m["loss"].block_until_ready()

    train_s = best_time(train, args.repeats * 3)
    peak = matmul_flops(1024, 5)
    out = {
        "devices": len(jax.devices()), "batch_size": b, "steps": k,
        "sample_images_per_s": {"scan_full_guidance": b / scan_full, "scan_interval_0.2_0.8": b / scan_interval,
                                "scan_no_guidance": b / scan_plain, "baseline_per_step_loop_full_guidance": b / baseline},
        "speedup_scan_vs_loop": baseline / scan_full,
        "train_images_per_s": b / train_s,
        "train_step_flops": flops,
        "train_utilisation": (flops / train_s / peak) if flops else None,
        "matmul_flops_per_s": peak,
    }
    if args.json:
        print(json.dumps(out))
        return
    loop_rate = out["sample_images_per_s"]["baseline_per_step_loop_full_guidance"]
    print(f"{out['devices']} device(s), batch {b}, {k} Euler steps, flow-digits-tiny DiT (random weights)\n")
    print(f"| {'sampler':<44} | {'images/s':>9} | {'vs loop':>7} |")
    print(f"|{'-' * 46}|{'-' * 11}|{'-' * 9}|")
    for name, rate in out["sample_images_per_s"].items():
        print(f"| {name.replace('_', ' '):<44} | {rate:9.1f} | {rate / loop_rate:6.2f}x |")
    util = f", {out['train_utilisation']:.1%} of matmul FLOP/s" if out["train_utilisation"] else ""
    print(f"\nflow train step: {out['train_images_per_s']:.1f} images/s{util}")


if __name__ == "__main__":
    main()
