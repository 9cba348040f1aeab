"""What an FSDP step gathers: all-gathers, bytes and dtypes of the compiled I-JEPA step, float32 against
bfloat16 compute, and whether each gathered weight was rounded to the compute dtype on its shard first.

    .venv/bin/python benchmarks/fsdp_gathers.py [--mesh data=2,fsdp=4] [--devices 8] [--json]

The benchmark step's model (benchmarks/train_step.py: ViT-tiny, 64 px, patch 8, predictor 6 x 96,
batch 32), compiled as `jepa train --mesh ...` compiles it, read from XLA's optimised HLO; nothing
runs. On a CPU-only machine the devices are simulated (--devices, XLA's
--xla_force_host_platform_device_count). A bfloat16 weight rounded on its shard before the gather
is what bfloat16 parameters with float32 master weights would give: the count says whether XLA
already does it. XLA:CPU computes bfloat16 matmuls in float32, so there the rounded weights travel as
float32; a GPU gathers them as bfloat16.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
from pathlib import Path

_count = sys.argv[sys.argv.index("--devices") + 1] if "--devices" in sys.argv else "8"  # before JAX starts
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={_count}"

import jax  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_step import TINY_STEP  # noqa: E402

BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1}
GATHER = re.compile(r"(%[\w.\-]+) = ([a-z0-9]+)\[([0-9,]*)\]\S* all-gather(?:-start)?\((%[\w.\-]+)")


def compiled_hlo(dtype: str, mesh_spec: str) -> str:
    """The optimised HLO text of the trainer's step on `mesh_spec` in compute `dtype`."""
    from jepa_cli.objectives import make_objective
    from jepa_cli.training import mesh as mesh_lib
    from jepa_cli.training.config import build_config
    from jepa_cli.training.run import abstract_state, build_optimizer
    from jepa_cli.training.step import jit_step, make_step_fn

    objective = make_objective("ijepa", {**TINY_STEP, "dtype": dtype}).with_total_updates(1000)
    cfg = build_config({"steps": 1000, "batch_size": 32})
    lengths = {"steps": 1000, "t_max": 1000, "warmup_steps": 100, "ipe": 100}
    params = jax.eval_shape(objective.init, jax.ShapeDtypeStruct((2,), np.uint32))
    tx, lr_fn, wd_fn, m_fn = build_optimizer(cfg, objective, lengths, params)
    mesh = mesh_lib.make_mesh(mesh_spec)
    abstract = abstract_state(objective, tx)
    shardings = mesh_lib.state_shardings(mesh, abstract)
    state = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), abstract, shardings)
    size = objective.config.image_size
    images = jax.ShapeDtypeStruct((32, size, size, 3), np.float32, sharding=mesh_lib.batch_sharding(mesh))
    step = jit_step(make_step_fn(objective, tx, lr_fn, wd_fn, m_fn), shardings, mesh_lib.batch_sharding(mesh),
                    mesh_lib.replicated(mesh))
    return step.lower(state, {"image": images}).compile().as_text()


def gathers(hlo: str) -> dict:
    """All-gathers by dtype (count, bytes) and how many gather a value that a convert produced."""
    producers = {m.group(1): m.group(2) for m in re.finditer(r"(%[\w.\-]+) = \S+ (\w[\w\-]*)\(", hlo)}
    count, nbytes, converted = collections.Counter(), collections.Counter(), 0
    for m in GATHER.finditer(hlo):
        dtype, dims, operand = m.group(2), m.group(3), m.group(4)
        count[dtype] += 1
        nbytes[dtype] += int(np.prod([int(d) for d in dims.split(",") if d])) * BYTES.get(dtype, 4)
        # a fused convert names its fusion (convert_fusion, convert_copy_fusion, ...)
        converted += "convert" in operand or producers.get(operand) == "convert"
    return {"gathers": dict(count), "bytes": dict(nbytes), "gathered_after_a_convert": converted}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mesh", default="data=2,fsdp=4")
    p.add_argument("--devices", type=int, default=8, help="simulated CPU devices (read before JAX starts)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    rows = {dtype: gathers(compiled_hlo(dtype, args.mesh)) for dtype in ("float32", "bfloat16")}
    if args.json:
        print(json.dumps({"mesh": args.mesh, "device": jax.devices()[0].device_kind, **rows}))
        return 0
    print(f"| compute dtype | all-gathers by dtype | gathered MB | gathered after a convert | ({args.mesh}, "
          f"{jax.devices()[0].device_kind}) |")
    print("|---|---|---|---|---|")
    base = sum(rows["float32"]["bytes"].values())
    for dtype, row in rows.items():
        total = sum(row["bytes"].values())
        print(f"| {dtype} | {row['gathers']} | {total / 1e6:.1f} ({total / base:.2f}x float32) | "
              f"{row['gathered_after_a_convert']} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
