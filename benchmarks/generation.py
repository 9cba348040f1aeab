"""Sample quality of a class-conditional flow run, as docs/generation.md reports it.

    .venv/bin/python benchmarks/generation.py --run runs/flow-digits --train digits-train.zarr \
        --test digits-test.zarr [--encoder runs/ijepa-digits] [--scales 2,4] [--interval 0.22,0.84] [--n 100]

For each setting (no guidance; guidance over the whole trajectory and in the interval, at each
scale) it samples n per class (`jepa sample`'s library path, Euler, 32 steps, seed 0) and reports
- agreement: the fraction of samples a linear probe (logistic regression on the real training data:
  pixels in [0, 1], or the latents themselves) assigns to the requested class;
- fd: `jepa fd` of the samples against the real test split, in the encoder's representation space
  for pixels with --encoder (else on pixels), on the latents as they are for a latent run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def features(path) -> tuple[np.ndarray, np.ndarray]:
    from jepa_cli.data import store

    x = store.read_array(Path(path) / "inputs")
    y = store.read_array(Path(path) / "labels")
    x = x.reshape(len(x), -1).astype(np.float64)
    return (x / 255.0 if store.read_attributes(path).get("modality") == "image" else x), y


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run", required=True)
    p.add_argument("--train", required=True)
    p.add_argument("--test", required=True)
    p.add_argument("--encoder", default=None)
    p.add_argument("--scales", default="2,4")
    p.add_argument("--interval", default="0.22,0.84")
    p.add_argument("--n", type=int, default=100)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--keep", default=None, help="Folder to keep the sample datasets in (default: a temporary one).")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    from jepa_cli.evaluation.fd import fd_datasets
    from jepa_cli.sampling.run import sample_run

    xtr, ytr = features(args.train)
    xte, yte = features(args.test)
    scaler = StandardScaler().fit(xtr)
    probe = LogisticRegression(max_iter=2000, C=1.0).fit(scaler.transform(xtr), ytr)
    rows = [{"setting": "real test split", "agreement": float(probe.score(scaler.transform(xte), yte)),
             "fd": fd_datasets(args.train, args.test, args.encoder)["fd"]}]
    interval = [float(v) for v in args.interval.split(",")]
    settings = [("no guidance", 1.0, None)]
    for w in (float(s) for s in args.scales.split(",")):
        settings += [(f"w={w:g} full", w, None), (f"w={w:g} interval {args.interval}", w, interval)]
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp())
    for i, (name, w, iv) in enumerate(settings):
        out = tmp / f"s{i}.zarr"
        rows_name = out
        start = time.perf_counter()
        sample_run(args.run, out, n=args.n, all_classes=True, guidance_scale=w, guidance_interval=iv,
                   steps=args.steps, batch_size=250, mesh=None)
        seconds = time.perf_counter() - start
        xs, ys = features(out)
        rows.append({"setting": name, "agreement": float(probe.score(scaler.transform(xs), ys)),
                     "fd": fd_datasets(out, args.test, args.encoder)["fd"], "seconds": round(seconds, 1),
                     "samples": str(rows_name)})
        print(json.dumps(rows[-1]), file=sys.stderr)
    if args.json:
        print(json.dumps(rows))
    else:
        for r in rows:
            print(f"{r['setting']:<28} agreement {r['agreement']:.3f}  fd {r['fd']:.4g}")


if __name__ == "__main__":
    main()
