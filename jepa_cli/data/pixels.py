"""Pixels of one image sample as ingest stores them: uint8 [H, W, C], converted from Pillow images
and numeric arrays by the range their type stands for, and resized (docs/formats.md, "Pixel values")."""

from __future__ import annotations

from typing import Any

import numpy as np

from jepa_cli.data.samples import BadSample

# Pillow modes a folder of images can hold, by how their pixels become uint8 (docs/formats.md):
EIGHT_BIT_MODES = {"1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "HSV"}
WIDE_MODES = {"I;16", "I;16L", "I;16B", "I;16N", "I", "F"}  # one channel of 16-bit, 32-bit or float values
GRAY_MODES = {"1", "L", "LA"} | WIDE_MODES  # kept as one channel by default


def to_uint8(sample: np.ndarray, name: str) -> np.ndarray:
    """Pixels as uint8, scaled by the range their dtype stands for (docs/formats.md, "Pixel values").

    uint8 passes; bool: x 255; uint16 (16-bit pixels): round(v / 257); other integers must lie in
    [0, 255] and pass; floats must be finite and in [0, 1]: round(v * 255). Anything else is a
    BadSample naming `name`.
    """
    if sample.dtype == np.uint8:
        return sample
    if sample.dtype == np.bool_:
        return sample.astype(np.uint8) * 255
    if sample.dtype.kind == "u" and sample.dtype.itemsize == 2:  # uint16, either byte order; 65535 / 257 = 255
        return np.round(sample / 257.0).astype(np.uint8)
    if np.issubdtype(sample.dtype, np.integer):
        if sample.size and (sample.min() < 0 or sample.max() > 255):
            raise BadSample(f"{name}: integer pixels outside [0, 255] (min {sample.min()}, max {sample.max()}); "
                            "store 8-bit values as uint8 or 16-bit values as uint16")
        return sample.astype(np.uint8)
    if np.issubdtype(sample.dtype, np.floating):
        if sample.size and (not np.isfinite(sample).all() or sample.min() < 0 or sample.max() > 1):
            raise BadSample(f"{name}: float pixels must be finite and lie in [0, 1] (min {sample.min():g}, "
                            f"max {sample.max():g}); rescale them first")
        return np.round(sample * 255.0).astype(np.uint8)
    raise BadSample(f"{name}: unsupported pixel dtype {sample.dtype}")


def to_pixels(sample: Any, channels: int | None, name: str) -> np.ndarray:
    """A PIL image or an array as uint8 [H, W, C] at its own size; C is `channels`, else 1 for
    gray modes and 3 for colour ones.

    16-bit and float images are scaled by their real range (`to_uint8`), never clipped: Pillow's own
    conversion to L saturates 16-bit values and truncates floats in [0, 1] to 0.
    """
    from PIL import Image

    if not isinstance(sample, np.ndarray):
        if sample.mode in WIDE_MODES:
            sample = _wide_pixels(sample, name)
        elif sample.mode not in EIGHT_BIT_MODES:
            raise BadSample(f"{name}: Pillow mode {sample.mode} is not supported; convert it to RGB or grayscale")
    if isinstance(sample, np.ndarray):
        if sample.ndim == 3 and sample.shape[-1] == 1:
            sample = sample[..., 0]  # [H, W]: Pillow's mode L
        native_channels = 1 if sample.ndim == 2 else sample.shape[-1]
        if native_channels in (1, 3) and channels in (None, native_channels):
            return sample[..., None] if sample.ndim == 2 else sample  # nothing to convert: skip Pillow
        sample = Image.fromarray(sample)
    mode = {1: "L", 3: "RGB"}.get(channels or 0) or ("L" if sample.mode in GRAY_MODES else "RGB")
    if sample.mode != mode:
        sample = sample.convert(mode)
    array = np.asarray(sample, dtype=np.uint8)
    return array[..., None] if array.ndim == 2 else array


def _wide_pixels(image: Any, name: str) -> np.ndarray:
    """uint8 [H, W] of a 16-bit (I;16*), 32-bit integer (I) or float (F) Pillow image.

    Mode I holds 16-bit files too (16-bit PGM): its values must lie in [0, 65535] and are scaled as
    16-bit; F must lie in [0, 1]."""
    values = np.asarray(image)
    if image.mode == "I":
        if values.size and (values.min() < 0 or values.max() > 65535):
            raise BadSample(f"{name}: 32-bit integer pixels outside [0, 65535] (min {values.min()}, max "
                            f"{values.max()}); save it as 8-bit or 16-bit")
        values = values.astype(np.uint16)
    return to_uint8(values, name)


def fit(image: np.ndarray, size: tuple[int, int] | None) -> np.ndarray:
    """uint8 [H, W, C] resized (bicubic) with a center crop to `size` = (H', W'); as is if None."""
    if size is None or image.shape[:2] == tuple(size):
        return image
    from PIL import Image, ImageOps

    picture = Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)
    array = np.asarray(ImageOps.fit(picture, (size[1], size[0]), method=Image.Resampling.BICUBIC), np.uint8)
    return array[..., None] if array.ndim == 2 else array


class ImageCodec:
    """How ingest converts an image source's samples (a video source brings video.ClipCodec)."""

    modality = "image"
    layout = "NHWC"
    pixels = staticmethod(lambda sample, channels, name: to_pixels(sample, channels, name))
    fit = staticmethod(lambda image, size: fit(image, size))

    @staticmethod
    def shape(native: tuple[int, ...], size: tuple[int, int] | None) -> tuple[int, ...]:
        """The stored shape [H, W, C] of a sample whose own shape is `native`."""
        return (*(size or native[:2]), native[2])

    @staticmethod
    def smaller(size: tuple[int, int] | None) -> str:
        """The options that shrink a sample, for a refusal's hint."""
        return f"a --size smaller than {size[0]}x{size[1]}" if size else "a smaller --size"
