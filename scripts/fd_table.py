"""Print a table of `jepa fd --json` results, one row per file, named by what follows `fd-` in the
file name (recipes/flow-digits.mk: fd-unguided.json, fd-guided.json, fd-interval.json).
    python scripts/fd_table.py [--title TEXT] FD.json...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--title", default="To the reference set")
    parser.add_argument("results", nargs="+", type=Path)
    args = parser.parse_args(argv)
    print(args.title)
    print(f"{'':<12}{'FD (lower)':>12}{'precision':>11}{'recall':>8}{'density':>9}{'coverage':>10}")
    for path in args.results:
        result = json.loads(path.read_text())
        name = path.stem.split("fd-", 1)[-1]
        figures = "".join("   n/a" if result[key] is None else f"{result[key]:>{width}.3f}"
                          for key, width in (("precision", 11), ("recall", 8), ("density", 9), ("coverage", 10)))
        print(f"{name:<12}{result['fd']:>12.3e}{figures}  ({result['n_a']} vs {result['n_b']}, dim {result['dim']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
