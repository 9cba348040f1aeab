"""Writes tests/data/golden/sigreg_lejepa.npz: the SIGReg statistic of rbalestr-lab/lejepa's own code
(lejepa/multivariate/slicing.py SlicingUnivariateTest around lejepa/univariate/epps_pulley.py
EppsPulley, reduction "mean") for a few fixed batches.

Run once with a separate environment that has torch (it is not a dependency of jepa-cli), on a
checkout of the reference:
    python3.11 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch numpy scipy
    git clone https://github.com/rbalestr-lab/lejepa /tmp/lejepa
    /tmp/torchenv/bin/python scripts/make_sigreg_golden.py /tmp/lejepa tests/data/golden/sigreg_lejepa.npz

SlicingUnivariateTest draws its directions itself, from a torch.Generator seeded with its step counter
(0 on the first call); the script draws the same directions the same way, checks that the Epps-Pulley
statistic on them reproduces the module's output, and stores them, so the test can hand them to
jepa_cli.objectives.sigreg.epps_pulley_sliced. Each case `NAME` stores `NAME/embeddings` (float32
[N, D]), `NAME/directions` (float32 [D, M]), `NAME/knots`, `NAME/t_max` and `NAME/statistic` (the
reference's float32 scalar).
"""

from __future__ import annotations

import sys

import numpy as np


def cases() -> dict[str, tuple[np.ndarray, int, int, float]]:
    """NAME -> (embeddings [N, D], slices M, knots, t_max)."""
    rng = np.random.default_rng(0)
    normal = rng.standard_normal((64, 8))
    skewed = rng.exponential(size=(48, 6))
    return {
        "normal": (normal, 16, 17, 3.0),  # the reference's defaults: 17 knots on [0, 3]
        "scaled": (3.0 * normal, 16, 17, 3.0),
        "skewed": (skewed, 32, 17, 3.0),
        "shifted_wide": (normal[:40, :5] + 0.5, 8, 21, 5.0),
        "collapsed": (np.full((32, 4), 0.7), 4, 17, 3.0),
    }


def main(lejepa: str, out: str) -> None:
    sys.path.insert(0, lejepa)
    import torch
    from lejepa.multivariate.slicing import SlicingUnivariateTest
    from lejepa.univariate.epps_pulley import EppsPulley

    arrays: dict[str, np.ndarray] = {}
    for name, (embeddings, slices, knots, t_max) in cases().items():
        x = torch.from_numpy(embeddings.astype(np.float32))
        test = SlicingUnivariateTest(EppsPulley(t_max=t_max, n_points=knots), num_slices=slices, reduction="mean")
        statistic = test(x)
        # slicing.py forward: seed = global step (0 on the first call), randn (D, M), columns to unit norm
        a = torch.randn((x.size(-1), slices), generator=torch.Generator().manual_seed(0))
        a /= a.norm(p=2, dim=0)
        again = EppsPulley(t_max=t_max, n_points=knots)(x @ a).mean()
        assert torch.equal(again, statistic), (name, again, statistic)
        arrays[f"{name}/embeddings"] = x.numpy()
        arrays[f"{name}/directions"] = a.numpy()
        arrays[f"{name}/knots"] = np.int64(knots)
        arrays[f"{name}/t_max"] = np.float64(t_max)
        arrays[f"{name}/statistic"] = statistic.detach().numpy().astype(np.float32)
        print(f"{name}: {float(statistic):.6g}")
    np.savez_compressed(out, **arrays)


if __name__ == "__main__":
    main(*sys.argv[1:])
