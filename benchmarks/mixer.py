"""Benchmark token mixers: one forward + backward pass of a block stack against sequence length.

Attention only (`attn`), S5 only (`s5`) and a 3:1 hybrid (`s5,s5,s5,attn`) at equal width and depth
(default width 64, depth 4, 4 heads, S5 state 64, batch 1), on 64 to 4,096 tokens. Each row gives the
step time (median of --repeats jitted steps after a compile), XLA's peak temporary memory of the
compiled step, and both as a ratio against attention measured in the same run; the crossover is
the first length at which a stack runs faster than attention.

    .venv/bin/python benchmarks/mixer.py [--lengths 64,256,1024,4096] [--width 64] [--depth 4]
                                         [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jepa_cli.models.mixer_pattern import parse_mixer
from jepa_cli.models.block import make_blocks, run_blocks

PATTERNS = {"attn": "attn", "s5": "s5", "hybrid 3:1": "s5,s5,s5,attn"}


def bench(pattern: str, length: int, width: int, depth: int, heads: int, state: int, repeats: int) -> dict:
    """Median seconds of one jitted loss-and-gradient step of `depth` blocks on [1, length, width]
    tokens, and the compiled step's temporary bytes (XLA's memory analysis)."""
    mixers = parse_mixer(pattern, depth)
    blocks = make_blocks(width, heads, 4.0, jnp.float32, nnx.Rngs(0), depth, mixers, state)
    graphdef, params = nnx.split(blocks)
    x = jax.random.normal(jax.random.key(1), (1, length, width), jnp.float32)

    def loss(params, x):
        return jnp.mean(run_blocks(nnx.merge(graphdef, params), x) ** 2)

    step = jax.jit(jax.value_and_grad(loss))
    compiled = step.lower(params, x).compile()
    memory = compiled.memory_analysis()
    jax.block_until_ready(compiled(params, x))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(params, x))
        times.append(time.perf_counter() - start)
    return {"seconds": float(np.median(times)),
            "temp_bytes": int(memory.temp_size_in_bytes) if memory is not None else None}


def measure(args) -> dict:
    rows = []
    for length in args.lengths:
        base = None
        for name, pattern in PATTERNS.items():
            r = bench(pattern, length, args.width, args.depth, args.heads, args.state, args.repeats)
            base = base or r
            rows.append({"mixer": name, "tokens": length, "ms": r["seconds"] * 1e3,
                         "temp_mib": (r["temp_bytes"] or 0) / 2**20,
                         "time_vs_attn": r["seconds"] / base["seconds"],
                         "memory_vs_attn": (r["temp_bytes"] or 0) / max(base["temp_bytes"] or 1, 1)})
    crossover = {name: next((r["tokens"] for r in rows if r["mixer"] == name and r["time_vs_attn"] < 1.0), None)
                 for name in PATTERNS if name != "attn"}
    return {"device": str(jax.devices()[0]), "width": args.width, "depth": args.depth, "heads": args.heads,
            "state": args.state, "rows": rows, "crossover_tokens": crossover}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=lambda s: [int(v) for v in s.split(",")], default=[64, 256, 1024, 4096])
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--state", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    out = measure(args)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{out['device']}: width {args.width}, depth {args.depth}, {args.heads} heads, S5 state {args.state}, "
          "batch 1, forward + backward")
    print(f"| {'mixer':<11} | {'tokens':>6} | {'ms/step':>9} | {'x attn':>6} | {'temp MiB':>9} | {'x attn':>6} |")
    print(f"|{'-' * 13}|{'-' * 8}|{'-' * 11}|{'-' * 8}|{'-' * 11}|{'-' * 8}|")
    for r in out["rows"]:
        print(f"| {r['mixer']:<11} | {r['tokens']:>6} | {r['ms']:9.1f} | {r['time_vs_attn']:6.2f} | "
              f"{r['temp_mib']:9.1f} | {r['memory_vs_attn']:6.2f} |")
    for name, tokens in out["crossover_tokens"].items():
        print(f"crossover ({name} faster than attention): " + (f"{tokens} tokens" if tokens else "not reached"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
