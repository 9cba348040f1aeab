"""The training input pipeline reading a dataset from local disk and from a local S3 server, same run.

    .venv/bin/python benchmarks/bucket_read.py [--batch 32] [--batches 60] [--images 2048] [--json]

Starts moto's S3 server (`moto[server]`, a test dependency) on 127.0.0.1, writes one dataset of
random 64x64x3 uint8 images both to a local folder and to the server (`jepa ingest`'s writer, the
same bytes), and times jepa train's DataLoader (the I-JEPA train transform, batch 32, 2 threads) on
each: the seconds to the first batch (opening the dataset and its first reads) and the images per
second after 5 warm-up batches (one untimed run first compiles what the loader runs). Twice: as training reads a dataset of at most 256 MiB (into memory
once), and streaming rows from TensorStore with its chunk cache (what a larger dataset does).
Prints a table with the ratio bucket / local.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np


def start_server() -> tuple[subprocess.Popen, str]:
    """moto's S3 server on a free port of 127.0.0.1, answering; (process, endpoint)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=1)
            break
        except urllib.error.HTTPError:
            break
        except OSError:
            time.sleep(0.1)
    return process, endpoint


def write_dataset(where, images: int) -> None:
    """`images` random 64x64x3 images as a dataset at `where` (a folder or a bucket URL)."""
    from jepa_cli.data import atomic, store

    pixels = np.random.default_rng(0).integers(0, 256, (images, 64, 64, 3), np.uint8)
    with atomic.atomic_directory(where, force=False, kind="dataset") as tmp:
        store.write_array(tmp / "inputs", pixels)
        store.write_group(tmp, store.base_attributes("dataset", modality="image", layout="NHWC", class_names=[]))


def time_loader(where, batch: int, batches: int, streaming: bool) -> dict[str, float]:
    """Seconds to the first batch and images/s after 5 warm-up batches of the DataLoader on `where`."""
    import jax

    from jepa_cli.objectives import make_objective
    from jepa_cli.training import data as data_lib
    from jepa_cli.training import mesh as mesh_lib

    in_memory = data_lib.IN_MEMORY_BYTES
    data_lib.IN_MEMORY_BYTES = 0 if streaming else in_memory
    try:
        objective = make_objective("ijepa", {"image_size": 64, "patch_size": 8, "channels": 3})
        mesh = mesh_lib.make_mesh("data=-1,fsdp=1")
        start = time.perf_counter()
        loader = data_lib.DataLoader(where, objective.train_transform(64), batch, 0, mesh_lib.batch_sharding(mesh),
                                     num_threads=2)
        jax.block_until_ready(next(loader))
        first = time.perf_counter() - start
        for _ in range(4):
            jax.block_until_ready(next(loader))
        start = time.perf_counter()
        for _ in range(batches):
            jax.block_until_ready(next(loader))
        return {"first_batch_s": first, "images_per_sec": batches * batch / (time.perf_counter() - start)}
    finally:
        data_lib.IN_MEMORY_BYTES = in_memory


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--batches", type=int, default=60)
    p.add_argument("--images", type=int, default=2048)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    process, endpoint = start_server()
    os.environ.update(AWS_ENDPOINT_URL_S3=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_REGION="us-east-1")
    try:
        import boto3

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="bench")
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            local, remote = Path(tmp) / "images.zarr", "s3://bench/images.zarr"
            write_dataset(local, args.images)
            write_dataset(remote, args.images)
            time_loader(local, args.batch, 5, streaming=False)  # compiles the transform's and the batch's programs
            for streaming in (False, True):
                a = time_loader(local, args.batch, args.batches, streaming)
                b = time_loader(remote, args.batch, args.batches, streaming)
                rows.append({"read": "streaming rows" if streaming else "into memory once", "local": a, "bucket": b,
                             "ratio": b["images_per_sec"] / a["images_per_sec"]})
    finally:
        process.terminate()
        process.wait(timeout=30)
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"| read ({args.images} images 64x64x3, batch {args.batch}) | local img/s | bucket img/s | ratio | "
          "local first batch, s | bucket first batch, s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['read']} | {r['local']['images_per_sec']:,.0f} | {r['bucket']['images_per_sec']:,.0f} | "
              f"{r['ratio']:.2f} | {r['local']['first_batch_s']:.2f} | {r['bucket']['first_batch_s']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
