"""Where the I-JEPA train step's time goes, per op class: a table from XLA's compiled program and a
profiler trace of a few steps.

    .venv/bin/python benchmarks/op_profile.py [--model tiny --image-size 64 --patch-size 8 --batch 32]
        [--pred-depth 6 --pred-width 96] [--dtype float32|bfloat16] [--attention-impl xla|dot_product]
        [--official-truncation] [--reference DIR [--reference-python PY]] [--steps 5] [--json]

`--reference DIR` (a facebookresearch/ijepa checkout, torch under `--reference-python`) profiles the
official step at the same size and batch on the CPU in the same run (benchmarks/official_ijepa_step.py
--profile: torch's profiler, the same classes by aten op) and adds its milliseconds per class and
ours/official; `--official-truncation` gives ours the official contexts' work.

The step is the trainer's (benchmarks/train_step.py compiled_step: sharded over a `data` mesh of every
device, the default masks). Each instruction of the compiled (optimised) HLO module is put in one
class from its opcode and the Python frames JAX recorded for it:

- matmuls: dots and convolutions outside attention (the Linear layers, the patch embedding);
- attention: what `Attention.__call__` or `fused_attention` (models/block.py) traced itself: QK^T, the mask, softmax, AV;
- gathers/scatters: gather, scatter, dynamic-slice and sort (picking context and target tokens,
  their gradients, the scan orders);
- optimizer+EMA: the gradient norm, AdamW (training/optimizer.py, optax) and the EMA update
  (training/step.py after the gradients);
- layernorm+elementwise: the rest (LayerNorm, GELU, residual adds, the loss, the masks' sampling),
  and copies.

A fusion takes the first class, in the order optimizer, attention, gathers, matmuls, that an
instruction inside it has. FLOPs: 2 x output x contracted size for a dot, one per output element
otherwise (their sum is XLA's cost_analysis figure); bytes: each top-level instruction's operands
and output, what it reads and writes in memory. Time: the profiler's events named after top-level
instructions (the XLA:CPU thunks on a CPU, the kernels of the device plane on a GPU), averaged over
`--steps` steps; `host/other` is the step's wall time minus that summed op time (dispatch and host
waits; negative where ops ran in parallel on several threads).
"""

from __future__ import annotations

import argparse
import collections
import glob
import inspect
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

CLASSES = ("matmuls", "attention", "gathers/scatters", "optimizer+EMA", "layernorm+elementwise")
GATHERS = {"gather", "scatter", "dynamic-slice", "dynamic-update-slice", "sort", "select-and-scatter"}
DOTS = {"dot", "convolution"}
CONTROL = {"while", "call", "conditional", "parameter", "constant", "tuple", "get-tuple-element"}
OPTIMIZER_FILES = ("training/optimizer.py", "training/ema.py", "/optax/")
ITEM_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
              "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}

_SHAPE = re.compile(r"\b(pred|[subfc]\d+)\[([\d,]*)\]")
# `%name = f32[2,3]{1,0} opcode(%a, %b), attrs, metadata={op_name="..." stack_frame_id=N}`
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([a-z][\w\-]*)\((.*)$")
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def _shapes_bytes_elements(text: str) -> tuple[int, int]:
    """Bytes and elements of every array shape written in `text` (a result type)."""
    total_bytes = total = 0
    for dtype, dims in _SHAPE.findall(text):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n
        total_bytes += n * ITEM_BYTES.get(dtype, 4)
    return total_bytes, total


def _stacks(lines: list[str]) -> dict[int, list[tuple[str, str, int]]]:
    """Stack frame id -> its (file, function, line) frames, innermost first, from the module's frame
    tables (a frame's parent_frame_id is the parent's id + 1; 0: none)."""
    tables: dict[str, dict[int, str]] = {}
    current = None
    for line in lines:
        if line in _TABLES:
            current = tables.setdefault(line, {})
        elif not line.strip() or line[0] not in "0123456789":
            current = None
        elif current is not None:
            key, rest = line.split(" ", 1)
            current[int(key)] = rest
    if "StackFrames" not in tables:
        return {}
    fields = lambda text: dict(re.findall(r"(\w+)=(\d+)", text))  # noqa: E731
    names = {k: v.strip('"') for k, v in tables["FileNames"].items()}
    functions = {k: v.strip('"') for k, v in tables["FunctionNames"].items()}
    locations = {k: fields(v) for k, v in tables["FileLocations"].items()}
    frames = {k: fields(v) for k, v in tables["StackFrames"].items()}
    stacks: dict[int, list] = {}
    for start in frames:
        chain, frame = [], start
        while frame in frames and len(chain) < 64:
            loc = locations[int(frames[frame]["file_location_id"])]
            chain.append((names[int(loc["file_name_id"])], functions[int(loc["function_name_id"])], int(loc["line"])))
            frame = int(frames[frame]["parent_frame_id"]) - 1
        stacks[start] = chain
    return stacks


def parse_hlo(text: str) -> dict[str, list[dict]]:
    """The computations of an HLO module's text: name (the entry's prefixed 'ENTRY ') -> instructions,
    each {name, opcode, out, operands, attrs, stack}: out the result type, operands the result types
    of its operands, stack the (file, function, line) frames JAX recorded, innermost first."""
    lines = text.splitlines()
    stacks = _stacks(lines)
    computations: dict[str, list[dict]] = {}
    current = None
    for line in lines:
        if not line.startswith(" "):
            m = _COMPUTATION.match(line.rstrip())
            current = computations.setdefault((m.group(1) and "ENTRY " or "") + m.group(2), []) if m else None
            types = {}
            continue
        m = _INSTRUCTION.match(line) if current is not None else None
        if not m:
            continue
        name, out, opcode, rest = m.groups()
        depth, i = 1, 0
        while i < len(rest) and depth:  # the operand list ends at its matching parenthesis
            depth += {"(": 1, ")": -1}.get(rest[i], 0)
            i += 1
        args, attrs = rest[:i - 1], rest[i:]
        types[name] = out
        operands = [types.get(a.strip().lstrip("%"), "") for a in args.split(",")] if args else []
        frame = re.search(r"stack_frame_id=(\d+)", attrs)
        current.append({"name": name, "opcode": opcode, "out": out, "operands": operands, "attrs": attrs,
                        "stack": stacks.get(int(frame.group(1)), []) if frame else []})
    return computations


def _regions() -> dict[str, tuple[str, str | tuple[str, ...], range | None]]:
    """Where each class is traced from: (file suffix, function or functions, lines or None for the
    whole function)."""
    from jepa_cli.training import step

    source, first = inspect.getsourcelines(step.make_step_fn)
    begin = next(i for i, s in enumerate(source) if "tx.update(" in s) - 1  # the gradient norm, then AdamW
    end = next(i for i, s in enumerate(source) if "new = TrainState(" in s)  # ... and the EMA
    return {"attention": ("models/block.py", ("Attention.__call__", "fused_attention"), None),
            "optimizer+EMA": ("training/step.py", "make_step_fn.<locals>.step_fn", range(first + begin, first + end))}


def classify_one(ins: dict, regions: dict) -> str:
    """The class of one instruction (not a fusion) from the frames it was traced from and its opcode:
    optimizer+EMA when any frame is the optimizer's or the EMA's; attention when the innermost frame
    outside flax is Attention.__call__ or the fused kernel's wrapper (the qkv and proj Linears are matmuls)."""
    own = [frame for frame in ins["stack"] if "/flax/" not in frame[0]]
    for file, function, line in own:
        if any(f in file for f in OPTIMIZER_FILES):
            return "optimizer+EMA"
        suffix, name, lines = regions["optimizer+EMA"]
        if file.endswith(suffix) and function == name and line in lines:
            return "optimizer+EMA"
    suffix, names, _ = regions["attention"]
    if own and own[0][0].endswith(suffix) and own[0][1] in names:
        return "attention"
    if ins["opcode"] in GATHERS:
        return "gathers/scatters"
    if ins["opcode"] in DOTS:
        return "matmuls"
    return "layernorm+elementwise"


def _dot_flops(ins: dict) -> float:
    """2 x output elements x the contracted size of a dot (its lhs's contracting dimensions)."""
    _, out = _shapes_bytes_elements(ins["out"])
    lhs = _SHAPE.search(ins["operands"][0]) if ins["operands"] else None
    dims = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", ins["attrs"])
    if not lhs or not dims:
        return 2.0 * out
    shape = [int(d) for d in filter(None, lhs.group(2).split(","))]
    k = 1
    for d in filter(None, dims.group(1).split(",")):
        k *= shape[int(d)]
    return 2.0 * out * k


def _conv_flops(ins: dict) -> float:
    """2 x output elements x (kernel elements / output features) of a convolution."""
    _, out = _shapes_bytes_elements(ins["out"])
    shapes = [_SHAPE.search(t) for t in ins["operands"][:2]]
    if len(shapes) < 2 or not all(shapes):
        return 2.0 * out
    kernel = [int(d) for d in filter(None, shapes[1].group(2).split(","))]
    out_features = max(kernel[-1], 1)
    size = 1
    for d in kernel:
        size *= d
    return 2.0 * out * size / out_features


def flops_of(ins: dict, computations: dict) -> float:
    """FLOPs of an instruction; a fusion's are those of the instructions it calls."""
    if ins["opcode"] == "fusion":
        called = re.search(r"calls=%?([\w.\-]+)", ins["attrs"])
        return sum(flops_of(i, computations) for i in computations.get(called.group(1), [])) if called else 0.0
    if ins["opcode"] == "dot":
        return _dot_flops(ins)
    if ins["opcode"] == "convolution":
        return _conv_flops(ins)
    if ins["opcode"] in CONTROL or ins["opcode"] in ("bitcast", "copy", "transpose", "reshape", "broadcast"):
        return 0.0
    return float(_shapes_bytes_elements(ins["out"])[1])


def classify(ins: dict, computations: dict, regions: dict) -> str:
    """A top-level instruction's class: a fusion's is the first of CLASSES (in order of precedence:
    optimizer, attention, gathers, matmuls, elementwise) that an instruction inside it has."""
    if ins["opcode"] != "fusion":
        return classify_one(ins, regions)
    called = re.search(r"calls=%?([\w.\-]+)", ins["attrs"])
    inner = {classify_one(i, regions) for i in computations.get(called.group(1), [])} if called else set()
    inner.add(classify_one(ins, regions))
    for cls in ("optimizer+EMA", "attention", "gathers/scatters", "matmuls"):
        if cls in inner:
            return cls
    return "layernorm+elementwise"


def op_table(hlo_text: str) -> dict[str, dict]:
    """Top-level instruction name -> {class, flops, bytes} for the module's entry computation and the
    bodies of its loops (a scanned stack's blocks)."""
    computations = parse_hlo(hlo_text)
    regions = _regions()
    entry = next(name for name in computations if name.startswith("ENTRY "))
    todo, seen, table = [entry], set(), {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for ins in computations.get(name, []):
            if ins["opcode"] in ("while", "call", "conditional"):
                todo += re.findall(r"(?:body|condition|to_apply|calls|branch_computations)=\{?%?([\w.\-]+)", ins["attrs"])
                continue
            if ins["opcode"] in CONTROL or ins["opcode"] == "bitcast":
                continue
            table[ins["name"]] = {"class": classify(ins, computations, regions),
                                  "flops": flops_of(ins, computations),
                                  "bytes": float(sum(_shapes_bytes_elements(t)[0] for t in (ins["out"], *ins["operands"])))}
    return table


def trace_times(trace_dir: str, names: set[str]) -> dict[str, float]:
    """Seconds per top-level instruction name summed over the trace's events: the device planes'
    (GPU kernels) where there are any, else the host's XLA threads (XLA:CPU thunks)."""
    from jax.profiler import ProfileData

    files = sorted(glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True))
    data = ProfileData.from_file(files[-1])
    planes = [p for p in data.planes if p.name.startswith("/device:")] or \
             [p for p in data.planes if p.name.startswith("/host:CPU")]
    out: dict[str, float] = collections.defaultdict(float)
    for plane in planes:
        for line in plane.lines:
            for event in line.events:
                name = event.name
                if name not in names:  # a GPU kernel carries its HLO op in a stat
                    stats = event.stats
                    pairs = stats.items() if hasattr(stats, "items") else (stats or ())
                    name = next((str(v) for k, v in pairs if k in ("hlo_op", "tf_op")), name)
                if name in names:
                    out[name] += event.duration_ns * 1e-9
    return out


def profile(args) -> dict:
    import jax

    from train_step import compiled_step

    options = dict(model=args.model, patch_size=args.patch_size, image_size=args.image_size, channels=3,
                   pred_depth=args.pred_depth, pred_width=args.pred_width, dtype=args.dtype, min_keep=args.min_keep,
                   width=args.width, depth=args.depth, heads=args.heads, attention_impl=args.attention_impl)
    compiled, state, batch, _, _ = compiled_step(args.official_truncation, args.batch, options)
    table = op_table(compiled.as_text())
    for _ in range(2):  # warm-up
        state, _ = compiled(state, batch)
    jax.block_until_ready(state)
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            state, _ = compiled(state, batch)
            jax.block_until_ready(state)
        wall = (time.perf_counter() - t0) / args.steps
        jax.profiler.stop_trace()
        times = trace_times(trace_dir, set(table))
    rows = {cls: {"ops": 0, "flops": 0.0, "bytes": 0.0, "seconds": 0.0} for cls in CLASSES}
    for name, op in table.items():
        row = rows[op["class"]]
        row["ops"] += 1
        row["flops"] += op["flops"]
        row["bytes"] += op["bytes"]
        row["seconds"] += times.get(name, 0.0) / args.steps
    op_seconds = sum(r["seconds"] for r in rows.values())
    device = jax.devices()[0]
    out = {"device": device.device_kind, "backend": jax.default_backend(), "devices": len(jax.devices()),
           "options": options, "official_truncation": args.official_truncation, "batch": args.batch,
           "step_s": wall, "op_s": op_seconds, "host_other_s": wall - op_seconds, "rows": rows}
    if args.reference:
        from train_step import reference_step

        out["reference"] = reference_step(
            args.reference, args.reference_python, args.steps, os.cpu_count() or 1, "--profile",
            "--batch", str(args.batch), "--model", f"vit_{args.model}", "--crop-size", str(args.image_size),
            "--patch-size", str(args.patch_size), "--pred-depth", str(args.pred_depth),
            "--pred-emb-dim", str(args.pred_width), "--min-keep", str(args.min_keep))
    return out


def print_table(out: dict) -> None:
    o = out["options"]
    ref = out.get("reference")
    mode = ", official truncation" if out.get("official_truncation") else ""
    print(f"{out['device']} ({out['backend']}, {out['devices']} device(s)): I-JEPA ViT-{o['model']} "
          f"{o['image_size']} px / patch {o['patch_size']}, predictor {o['pred_depth']} x {o['pred_width']}, "
          f"batch {out['batch']}, {o['dtype']}{mode}; step {1000 * out['step_s']:.1f} ms"
          + (f"; official step {ref['step_ms']:.1f} ms (torch {ref['torch']}, {ref['threads']} threads)" if ref else "")
          + "\n")
    extra_head = f" {'official ms':>11} | {'ours/official':>13} |" if ref else ""
    print(f"| {'op class':<22} | {'ops':>5} | {'GFLOP':>8} | {'MB moved':>9} | {'ms':>8} | {'share':>6} | {'GFLOP/s':>8} |"
          + extra_head)
    print(f"|{'-' * 24}|{'-' * 7}|{'-' * 10}|{'-' * 11}|{'-' * 10}|{'-' * 8}|{'-' * 10}|"
          + (f"{'-' * 13}|{'-' * 15}|" if ref else ""))
    wall = out["step_s"]

    def compare(ours: float, theirs: float | None) -> str:
        if not ref:
            return ""
        if theirs is None:
            return f" {'':>11} | {'':>13} |"
        return f" {1000 * theirs:11.2f} | {ours / theirs if theirs else float('nan'):13.2f} |"

    classes = (ref or {}).get("op_classes") or {}
    for cls, r in out["rows"].items():
        rate = r["flops"] / r["seconds"] / 1e9 if r["seconds"] else 0.0
        print(f"| {cls:<22} | {r['ops']:5d} | {r['flops'] / 1e9:8.3f} | {r['bytes'] / 1e6:9.1f} | "
              f"{1000 * r['seconds']:8.2f} | {r['seconds'] / wall:6.1%} | {rate:8.1f} |" + compare(r["seconds"], classes.get(cls)))
    theirs_other = ref["step_ms"] / 1000 - sum(classes.values()) if ref and classes else None
    print(f"| {'host/other':<22} | {'':>5} | {'':>8} | {'':>9} | {1000 * out['host_other_s']:8.2f} | "
          f"{out['host_other_s'] / wall:6.1%} | {'':>8} |" + compare(out["host_other_s"], theirs_other))
    if ref:
        print(f"| {'step':<22} | {'':>5} | {'':>8} | {'':>9} | {1000 * wall:8.2f} | {'':>6} | {'':>8} |"
              + compare(wall, ref["step_ms"] / 1000))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--patch-size", type=int, default=8)
    p.add_argument("--pred-depth", type=int, default=6)
    p.add_argument("--pred-width", type=int, default=96)
    p.add_argument("--min-keep", type=int, default=4)
    p.add_argument("--width", type=int, help="override the model size's width (tiny smoke tests)")
    p.add_argument("--depth", type=int, help="override the model size's depth")
    p.add_argument("--heads", type=int, help="override the model size's heads")
    p.add_argument("--attention-impl", choices=("xla", "dot_product"), default="xla")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--official-truncation", action="store_true", help="the official contexts' work (equal work)")
    p.add_argument("--reference", help="a checkout of facebookresearch/ijepa: profile the official step too")
    p.add_argument("--reference-python", default=sys.executable, help="a Python with torch (default: this one)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    out = profile(args)
    if args.json:
        print(json.dumps(out))
    else:
        print_table(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
