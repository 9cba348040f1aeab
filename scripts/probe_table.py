"""Print a table of `jepa probe --json` results: one row per feature set, one column per probe.

Rows are named from each result's `encoder` field (the run, step and weights that produced the
features; null for --raw), so the order of the files does not matter.
    python scripts/probe_table.py [--title TEXT] PROBE.json...   (a file may hold several results, one per line)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PROBE_NAMES = {"linear": "linear", "knn": "k-NN", "attentive": "attentive"}
NEAR_INIT = 0.5  # jepa_cli/training/ema.py KEPT_WARNING: a target holding more of its init hardly learned


def row_name(result: dict) -> str:
    encoder = result.get("encoder")
    if encoder is None:
        return "raw inputs (--raw)"
    what = f"{Path(encoder['run']).name} {encoder['weights']} encoder, step {encoder['step']}"
    if encoder["step"] == 0:
        return what + " (random init)"
    kept = encoder.get("init_weight")
    if isinstance(kept, (int, float)) and kept > NEAR_INIT:  # the EMA has hardly moved it (docs/recipes.md)
        return what + f" (still {kept:.2f} random init)"
    return what


def table(results: list[dict], title: str) -> str:
    probes = [p for p in PROBE_NAMES if any(r["probe"] == p for r in results)]
    rows: dict[str, dict[str, float]] = {}
    for result in results:
        rows.setdefault(row_name(result), {})[result["probe"]] = result["top1"]
    first = results[0]
    width = max(len(name) for name in rows) + 2
    lines = [f"{title}, top-1 accuracy ({first['n_train']} train / {first['n_test']} test)",
             "features".ljust(width) + "".join(f"{PROBE_NAMES[p]:>8}" for p in probes)]
    for name in sorted(rows, key=lambda n: (not n.startswith("raw"), "random init" not in n, n)):
        lines.append(name.ljust(width) + "".join(
            f"{rows[name][p]:>8.3f}" if p in rows[name] else f"{'-':>8}" for p in probes))
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--title", default="probes")
    parser.add_argument("results", nargs="+", type=Path)
    args = parser.parse_args(argv)
    results = [json.loads(line) for path in args.results for line in path.read_text().splitlines() if line.strip()]
    sys.stdout.write(table(results, args.title))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
