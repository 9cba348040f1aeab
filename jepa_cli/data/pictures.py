"""The pictures of `jepa info DATA --png`: a strip of frames per sample (images, video) or the log-mel
spectrograms of the first clips (audio), each written atomically as a PNG."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from jepa_cli.data import atomic, store
from jepa_cli.data.fbank import fbank
from jepa_cli.data.log_mel import RAW_MEL_BINS, raw_fbank_config
from jepa_cli.data.preview import preview_images
from jepa_cli.data.store import utf8_text
from jepa_cli.errors import InputError

def write_strip_png(data: str | Path, png: str | Path, samples: int, force: bool = False) -> str:
    """A PNG of the first `samples` samples of a dataset: one row of frames per clip (an image is a
    one-frame clip), frames scaled up to at least 64 pixels high; written atomically (atomic.write_file)."""
    import io

    from PIL import Image

    atomic.check_output_file(png, force, atomic.PNG_MAGIC, "PNG picture", [data])
    x = preview_images(str(data), samples)  # uint8 [n, (T,) H, W, 3]
    if x.ndim == 4:
        x = x[:, None]
    n, t, h, w, _ = x.shape
    scale = max(1, -(-64 // h))
    gap = 2 * scale
    picture = np.full((n * (h * scale + gap) - gap, t * (w * scale + gap) - gap, 3), 255, np.uint8)
    for i in range(n):
        for f in range(t):
            tile = np.kron(x[i, f], np.ones((scale, scale, 1), np.uint8))
            top, left = i * (h * scale + gap), f * (w * scale + gap)
            picture[top:top + h * scale, left:left + w * scale] = tile
    buffer = io.BytesIO()
    Image.fromarray(picture).save(buffer, format="PNG")
    atomic.write_file(png, buffer.getvalue(), force, atomic.PNG_MAGIC, "PNG picture")
    return str(png)


PICTURE_RANGE = 80.0 * math.log(10.0) / 10.0  # 80 dB of power, in natural-log units (18.4)
PICTURE_GAP = 2  # pixels between two spectrograms


def spectrogram_png(dataset: str | Path, png_path: str | Path, samples: int = 4, force: bool = False) -> dict[str, Any]:
    """Draws the log-mel spectrograms of an audio dataset's first `samples` clips, one under the
    other (time left to right, low frequencies at the bottom, the loudest 80 dB of each clip from
    black to white), the front-end of `pooled_log_mel` without the time average; written atomically
    as a PNG (`force` replaces only a PNG). Returns {"png", "samples", "frames", "mel_bins"}."""
    import io

    import jax
    from PIL import Image

    dataset = Path(dataset)
    attrs = store.read_attributes(dataset)
    if attrs.get("modality") != "audio":
        raise InputError(f"{dataset}: --png draws audio datasets (spectrograms); this one holds "
                         f"{attrs.get('modality')!r}")
    if samples < 1:
        raise InputError(f"--samples must be positive, got {samples}")
    atomic.check_output_file(png_path, force, atomic.PNG_MAGIC, "PNG picture", [dataset])
    inputs = store.open_array(dataset / "inputs")
    clips = np.asarray(store.read(inputs, slice(0, min(samples, int(inputs.shape[0])))))
    if clips.dtype == np.int16:
        clips = clips.astype(np.float32) / np.float32(32768.0)
    rate = int(attrs.get("sample_rate") or 0)
    if rate <= 0:
        raise InputError(f"{dataset}: has no sample_rate attribute; ingest it again")
    config = raw_fbank_config(rate)
    if config.frames(clips.shape[-1]) == 0:
        raise InputError(f"{dataset}: clips of {clips.shape[-1]} samples are shorter than one 25 ms frame")
    spec = np.asarray(jax.jit(lambda w: fbank(w, config))(clips.astype(np.float32)))  # [n, frames, bins]
    top = spec.max(axis=(1, 2), keepdims=True)
    level = np.clip((spec - (top - PICTURE_RANGE)) / PICTURE_RANGE, 0.0, 1.0)
    tiles = [np.round(255 * level[i].T[::-1]).astype(np.uint8) for i in range(len(level))]  # [bins, frames]
    gap = np.full((PICTURE_GAP, tiles[0].shape[1]), 128, np.uint8)
    picture = np.concatenate([part for tile in tiles for part in (tile, gap)][:-1], axis=0)
    buffer = io.BytesIO()
    Image.fromarray(picture, "L").save(buffer, format="PNG")
    atomic.write_file(png_path, buffer.getvalue(), force, atomic.PNG_MAGIC, "PNG picture")
    return {"png": utf8_text(str(png_path)), "samples": len(tiles), "frames": int(spec.shape[1]),
            "mel_bins": RAW_MEL_BINS}
