"""Screen changes to a recipe by the probes they give: each variant is trained, its target encoder
encoded on TRAIN and TEST, and scored with `jepa probe linear` and `jepa probe knn`, several variants
at a time in separate processes (docs/small-data.md, "Screening on a GPU").

    python scripts/recipe_sweep.py --recipe builtin:ijepa-small32 --train c-train.zarr --test c-test.zarr \\
        --variants variants.json --out sweep/ [--parallel 5] [--deadline 400]

variants.json is a list of {"name": ..., "set": {"key": value, "ijepa.key": value}}: top-level recipe
keys, or `[ijepa]` keys with the prefix. Each variant's recipe, run and features go to OUT/NAME/; one
JSON line per variant (the overrides, the run's final metrics, both top-1s, or the error) is appended
to OUT/results.jsonl. No variant starts after --deadline seconds. Not used by the tests.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import tomli_w

from jepa_cli.training.config import recipe_path

JEPA = [sys.executable, "-m", "jepa_cli"]


def variant_recipe(base: dict, overrides: dict) -> dict:
    """The base recipe (a parsed TOML document) with `key` / `section.key` overrides applied."""
    recipe = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for dotted, value in overrides.items():
        *section, key = dotted.split(".")
        (recipe.setdefault(section[0], {}) if section else recipe)[key] = value
    return recipe


def jepa(args: list[str], err: Path) -> dict:
    """Runs one jepa command with --json; its last stdout line, parsed. RuntimeError on failure."""
    done = subprocess.run(JEPA + args + ["--json", "-q"], capture_output=True, text=True)
    err.write_text(done.stderr)
    if done.returncode:
        raise RuntimeError(f"jepa {args[0]} exited {done.returncode}: {done.stderr.strip()[-300:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_variant(variant: dict, base: dict, train: Path, test: Path, out: Path) -> dict:
    folder = out / variant["name"]
    result: dict = {"name": variant["name"], "set": variant["set"]}
    start = time.time()
    try:
        folder.mkdir(parents=True, exist_ok=False)  # never reuse a variant's folder
        (folder / "recipe.toml").write_text(tomli_w.dumps(variant_recipe(base, variant["set"])))
        summary = jepa(["train", "--config", str(folder / "recipe.toml"), "--data", str(train),
                        "--out", str(folder / "run")], folder / "train.err")
        result["train_seconds"] = round(time.time() - start, 1)
        result["final"] = {k: v for k, v in summary.items() if isinstance(v, (int, float))}
        for split, data in (("train", train), ("test", test)):
            jepa(["encode-latents", str(folder / "run"), str(data), "-o", str(folder / f"target-{split}.zarr"),
                  "--weights", "target"], folder / f"encode-{split}.err")
        for probe in ("linear", "knn"):
            result[probe] = jepa(["probe", probe, str(folder / "target-train.zarr"), str(folder / "target-test.zarr")],
                                 folder / f"{probe}.err")["top1"]
    except (OSError, RuntimeError, json.JSONDecodeError, IndexError) as exc:
        result["error"] = str(exc)
    result["seconds"] = round(time.time() - start, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--train", type=Path, required=True)
    parser.add_argument("--test", type=Path, required=True)
    parser.add_argument("--variants", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--deadline", type=float, default=float("inf"), help="seconds after which no variant starts")
    args = parser.parse_args()
    base = tomllib.loads(recipe_path(args.recipe).read_text())
    queue = json.loads(args.variants.read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    lock, start = threading.Lock(), time.time()

    def worker() -> None:
        while True:
            with lock:
                if not queue or time.time() - start > args.deadline:
                    return
                variant = queue.pop(0)
            result = run_variant(variant, base, args.train, args.test, args.out)
            with lock:
                with open(args.out / "results.jsonl", "a") as results:
                    results.write(json.dumps(result) + "\n")
                print(json.dumps(result), flush=True)

    threads = [threading.Thread(target=worker) for _ in range(args.parallel)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if queue:
        print(f"not run (deadline): {[v['name'] for v in queue]}", file=sys.stderr)


if __name__ == "__main__":
    main()
