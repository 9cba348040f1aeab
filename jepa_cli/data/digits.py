"""`builtin:digits`: the 8x8 handwritten digits that ship with scikit-learn, read without importing it."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from jepa_cli.errors import InputError


def load_digit_images() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The 1,797 8x8 handwritten digits bundled with scikit-learn (UCI optdigits test set): images
    uint8 [1797, 8, 8] in 0..255, labels int32 [1797] and the class names "0".."9". scikit-learn is
    the optional `digits` extra.

    The file is read as sklearn.datasets.load_digits reads it (sklearn/datasets/_base.py: 64 pixel
    columns in 0..16, then the label), without importing scikit-learn, which takes 2 s."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")  # locates the package without importing it
    folder = Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None
    table = folder / "datasets" / "data" / "digits.csv.gz" if folder else None
    if table is None or not table.is_file():
        raise InputError("builtin digits need scikit-learn: pip install 'jepa-cli[digits]'")
    with gzip.open(table, "rt", encoding="utf-8") as fh:
        rows = np.loadtxt(fh, delimiter=",")  # [1797, 65]
    images = np.round(rows[:, :-1].reshape(-1, 8, 8) * (255.0 / 16.0)).astype(np.uint8)
    labels = rows[:, -1].astype(np.int32)
    return images, labels, [str(c) for c in range(10)]
