"""Fetches the Free Spoken Digit Dataset (FSDD, github.com/Jakobovski/free-spoken-digit-dataset, tag
v1.0.10: 3,000 recordings of the digits 0-9, 6 speakers x 50 per digit, mono wav at 8 kHz, trimmed of
silence, 0.1-2.3 s) as two folders of wav files that `jepa ingest` reads, for the audio measurements of
docs/audio.md. Not used by the tests or the package.

Files are named DIGIT_SPEAKER_INDEX.wav. The split is FSDD's own (its README): recordings 0-4 of each
speaker and digit are the test set (300), 5-49 the training set (2,700); `--test-speaker NAME` holds out
one speaker instead (every recording of NAME is the test set), which asks more of the features.

    python scripts/fetch_fsdd.py DIR                       # downloads the v1.0.10 archive from GitHub
    python scripts/fetch_fsdd.py DIR --source CLONE        # or copies from a clone (or a bare mirror) of the repository
    jepa ingest DIR/train fsdd-train.zarr --sample-rate 16000 --seconds 1 --label-regex '^(\\d)_'
    jepa ingest DIR/test  fsdd-test.zarr  --sample-rate 16000 --seconds 1 --label-regex '^(\\d)_'
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

TAG = "v1.0.10"
URL = f"https://github.com/Jakobovski/free-spoken-digit-dataset/archive/refs/tags/{TAG}.tar.gz"
NAME = re.compile(r"^(\d)_([a-z]+)_(\d+)\.wav$")
EXPECTED = 3000


def _from_archive(data: bytes) -> dict[str, bytes]:
    files = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        for member in archive.getmembers():
            name = member.name.rsplit("/", 1)[-1]
            if member.isfile() and "/recordings/" in member.name and NAME.match(name):
                files[name] = archive.extractfile(member).read()
    return files


def _from_git(source: Path) -> dict[str, bytes]:
    """The recordings of `TAG` in a clone or a bare mirror of the repository."""
    def git(*args: str) -> bytes:
        return subprocess.run(["git", "-C", str(source), *args], check=True, capture_output=True).stdout

    listing = git("ls-tree", f"{TAG}:recordings").decode().splitlines()
    files = {}
    for line in listing:
        meta, name = line.split("\t", 1)
        if NAME.match(name):
            files[name] = git("cat-file", "blob", meta.split()[2])
    return files


def main(out: Path, source: str | None, test_speaker: str | None) -> None:
    if source is None:
        with urllib.request.urlopen(URL) as response:
            files = _from_archive(response.read())
    else:
        files = _from_git(Path(source))
    if len(files) != EXPECTED:
        raise SystemExit(f"found {len(files)} recordings, expected {EXPECTED} (FSDD {TAG})")
    speakers = {NAME.match(n).group(2) for n in files}
    if test_speaker is not None and test_speaker not in speakers:
        raise SystemExit(f"--test-speaker {test_speaker}: not one of {', '.join(sorted(speakers))}")
    for split in ("train", "test"):
        folder = out / split
        if folder.exists():
            raise SystemExit(f"{folder}: exists; choose a new DIR")
    counts = {"train": 0, "test": 0}
    for split in counts:
        (out / split).mkdir(parents=True)
    for name, data in sorted(files.items()):
        _, speaker, index = NAME.match(name).groups()
        test = speaker == test_speaker if test_speaker else int(index) < 5
        split = "test" if test else "train"
        (out / split / name).write_bytes(data)
        counts[split] += 1
    print(f"{out}/train: {counts['train']} recordings, {out}/test: {counts['test']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--source", default=None, help="a clone or bare mirror of the repository (default: download)")
    parser.add_argument("--test-speaker", default=None, help="hold out this speaker instead of FSDD's split")
    args = parser.parse_args()
    try:
        main(args.out, args.source, args.test_speaker)
    except subprocess.CalledProcessError as exc:
        sys.exit(f"git: {exc.stderr.decode().strip()}")
