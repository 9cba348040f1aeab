"""Per-example NumPy image transforms for the data pipeline.

Each transform is ``fn(example: dict, rng: np.random.Generator) -> dict``: it reads
``example["image"]`` (uint8 [H, W, C]) and returns a copy of the example whose "image" is float32
[S, S, C], normalised by mean/std. Resizing is Pillow bilinear (as torchvision on PIL images).

The training transforms can leave the normalisation to the device (`on_device`, option
`device_normalise`): they then return the resized uint8 pixels, a quarter of the bytes to move, and
carry the float half as ``transform.device`` (a `DeviceNormalise`), which the train step applies to
the batch: the same float32 arithmetic as `_normalise`, to one rounding (XLA's division).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from PIL import Image

from jepa_cli.errors import InputError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _size(s) -> tuple[int, int]:
    if isinstance(s, (tuple, list)):
        return int(s[0]), int(s[1])
    return int(s), int(s)


def _resize_pixels(image: np.ndarray, box: tuple[float, float, float, float], size) -> np.ndarray:
    """Crop ``box`` (left, top, right, bottom) of uint8 [H, W, C] (C 1 or 3) and resize to size (h, w):
    uint8 [h, w, C], as Pillow rounds its output."""
    h, w = size
    c = image.shape[2]
    if c not in (1, 3):
        raise InputError(f"--device-normalise takes 1- or 3-channel pixels (Pillow resizes them as uint8), "
                         f"these have {c}")
    pil = Image.fromarray(image[..., 0] if c == 1 else image, "L" if c == 1 else "RGB")
    return np.asarray(pil.resize((w, h), Image.BILINEAR, box=box)).reshape(h, w, c)


def _resize(image: np.ndarray, box: tuple[float, float, float, float], size) -> np.ndarray:
    """Crop ``box`` (left, top, right, bottom) of uint8 [H, W, C] and resize to size (h, w): float32."""
    h, w = size
    c = image.shape[2]
    if c in (1, 3):
        return _resize_pixels(image, box, size).astype(np.float32)
    chans = [
        np.asarray(
            Image.fromarray(image[..., i].astype(np.float32), "F").resize(
                (w, h), Image.BILINEAR, box=box
            )
        )
        for i in range(c)
    ]
    return np.stack(chans, axis=-1).astype(np.float32)


def _normalise(x: np.ndarray, mean, std) -> np.ndarray:
    mean = np.asarray(mean, np.float32) * 255.0
    std = np.asarray(std, np.float32) * 255.0
    return ((x - mean) / std).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class DeviceNormalise:
    """The float half of a training transform, applied in the train step: batch[key] uint8 pixels
    [B, ..., C] -> float32 (x - 255 mean) / (255 std), per channel, as `_normalise` on the host."""

    key: str
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __call__(self, batch: dict) -> dict:
        import jax.numpy as jnp

        return {**batch, self.key: _normalise(batch[self.key].astype(jnp.float32), self.mean, self.std)}


def _as_hwc(image) -> np.ndarray:
    image = np.asarray(image)
    if image.ndim == 2:
        image = image[..., None]
    if image.dtype != np.uint8:
        image = np.clip(image, 0, 255).astype(np.uint8)
    return image


def random_resized_crop_box(
    height: int, width: int, rng: np.random.Generator, scale=(0.3, 1.0), ratio=(3 / 4, 4 / 3)
) -> tuple[int, int, int, int]:
    """torchvision RandomResizedCrop.get_params: (top, left, h, w)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def random_resized_crop(
    image_size, mean=IMAGENET_MEAN, std=IMAGENET_STD, scale=(0.3, 1.0), ratio=(3 / 4, 4 / 3),
    on_device: bool = False,
):
    """Training transform: RandomResizedCrop to image_size, no flip, mean/std normalisation (left to
    the device with `on_device`: uint8 out, ``transform.device`` normalises the batch)."""
    size = _size(image_size)

    def transform(example: dict, rng: np.random.Generator) -> dict:
        image = _as_hwc(example["image"])
        top, left, h, w = random_resized_crop_box(image.shape[0], image.shape[1], rng, scale, ratio)
        box = (left, top, left + w, top + h)
        if on_device:
            return {**example, "image": _resize_pixels(image, box, size)}
        return {**example, "image": _normalise(_resize(image, box, size), mean, std)}

    if on_device:
        transform.device = DeviceNormalise("image", tuple(mean), tuple(std))
    return transform


def resize_center_crop(image_size, mean=IMAGENET_MEAN, std=IMAGENET_STD, resize_ratio=256 / 224):
    """Evaluation transform: resize the shorter side to round(size * resize_ratio), centre crop
    to image_size, mean/std normalisation (the usual Resize(256) + CenterCrop(224))."""
    size = _size(image_size)

    def transform(example: dict, rng: np.random.Generator | None = None) -> dict:
        image = _as_hwc(example["image"])
        hh, ww = image.shape[:2]
        short = max(int(size[0] * resize_ratio), size[0], size[1])
        if hh <= ww:
            rh, rw = short, max(int(short * ww / hh), size[1])
        else:
            rh, rw = max(int(short * hh / ww), size[0]), short
        # resize then crop, done as one box resize: the crop in source coordinates
        sy, sx = hh / rh, ww / rw
        top = int(round((rh - size[0]) / 2.0))
        left = int(round((rw - size[1]) / 2.0))
        box = (left * sx, top * sy, (left + size[1]) * sx, (top + size[0]) * sy)
        x = _resize(image, box, size)
        return {**example, "image": _normalise(x, mean, std)}

    return transform


def clip_random_resized_crop(image_size, mean=IMAGENET_MEAN, std=IMAGENET_STD, scale=(0.3, 1.0),
                             ratio=(0.75, 1.35), hflip: bool = True, on_device: bool = False):
    """Video training transform (V-JEPA app/vjepa/transforms.py): one RandomResizedCrop box and one
    horizontal flip (probability 0.5) drawn per clip and applied to every frame of
    ``example["video"]`` (uint8 [T, H, W, C]) -> float32 [T, S, S, C], mean/std normalised (with
    `on_device`: uint8 [T, S, S, C], and ``transform.device`` normalises the batch)."""
    size = _size(image_size)
    resize = _resize_pixels if on_device else _resize

    def transform(example: dict, rng: np.random.Generator) -> dict:
        clip = np.asarray(example["video"])
        top, left, h, w = random_resized_crop_box(clip.shape[1], clip.shape[2], rng, scale, ratio)
        flip = hflip and rng.random() < 0.5
        frames = [resize(_as_hwc(f), (left, top, left + w, top + h), size) for f in clip]
        x = np.stack(frames)
        if flip:
            x = x[:, :, ::-1]
        x = np.ascontiguousarray(x)
        return {**example, "video": x if on_device else _normalise(x, mean, std)}

    if on_device:
        transform.device = DeviceNormalise("video", tuple(mean), tuple(std))
    return transform


def clip_resize_center_crop(image_size, mean=IMAGENET_MEAN, std=IMAGENET_STD, resize_ratio=256 / 224):
    """Video evaluation transform: every frame as `resize_center_crop` (shorter side to
    size x 256/224, centre crop): uint8 [T, H, W, C] -> float32 [T, S, S, C]."""
    frame = resize_center_crop(image_size, mean, std, resize_ratio)

    def transform(example: dict, rng: np.random.Generator | None = None) -> dict:
        clip = np.asarray(example["video"])
        x = np.stack([frame({"image": f})["image"] for f in clip])
        return {**example, "video": x}

    return transform


GRAY_WEIGHTS = (0.299, 0.587, 0.114)  # torchvision rgb_to_grayscale (ITU-R 601-2 luma)


def _gray(x: np.ndarray) -> np.ndarray:
    """float [h, w, 3] -> its luma [h, w, 1]."""
    return (x @ np.asarray(GRAY_WEIGHTS, np.float32))[..., None]


def colour_jitter(x: np.ndarray, rng: np.random.Generator, strengths=(0.4, 0.4, 0.2)) -> np.ndarray:
    """torchvision ColorJitter(brightness, contrast, saturation) on float pixels [h, w, C] in [0, 255]:
    each factor drawn in [max(0, 1 - s), 1 + s], the three applied in a random order, each result
    clipped to [0, 255]. Saturation needs colour: 1- or other non-3-channel images skip it."""
    colour = x.shape[-1] == 3
    for op in rng.permutation(3):
        s = strengths[op]
        factor = rng.uniform(max(0.0, 1.0 - s), 1.0 + s)
        if op == 0:  # brightness: blend with black
            x = x * factor
        elif op == 1:  # contrast: blend with the mean grey level
            x = x * factor + (1.0 - factor) * float(np.mean(_gray(x) if colour else x))
        elif colour:  # saturation: blend with the grey image
            x = x * factor + (1.0 - factor) * _gray(x)
        x = np.clip(x, 0.0, 255.0)
    return x.astype(np.float32)


@dataclasses.dataclass(frozen=True)
class ViewSpec:
    """One kind of view (global or local): how many, their size (h, w), crop area scale and, for
    clips, their length in frames (None: images)."""

    count: int
    size: tuple[int, int]
    scale: tuple[float, float]
    frames: int | None = None


def _augment(x: np.ndarray, rng: np.random.Generator, hflip: bool, jitter_prob: float, jitter,
             grayscale_prob: float) -> np.ndarray:
    """float pixels [..., h, w, C] in [0, 255] (an image or every frame of a clip, one draw for all):
    flipped horizontally with probability 0.5, colour-jittered with probability `jitter_prob`, turned
    grey with probability `grayscale_prob` (3 channels only)."""
    if hflip and rng.random() < 0.5:
        x = x[..., ::-1, :]
    if rng.random() < jitter_prob:
        x = colour_jitter(x, rng, jitter)
    if x.shape[-1] == 3 and rng.random() < grayscale_prob:
        x = np.repeat(_gray(x), 3, axis=-1)
    return np.ascontiguousarray(x)


def multi_view(views: tuple[ViewSpec, ...], keys: tuple[str, ...], mean=IMAGENET_MEAN, std=IMAGENET_STD,
               ratio=(3 / 4, 4 / 3), hflip: bool = True, jitter_prob: float = 0.8, jitter=(0.4, 0.4, 0.2),
               grayscale_prob: float = 0.2):
    """Multi-crop training transform (DINO's, as LeJEPA's README.md gives it): for each ViewSpec,
    `count` random resized crops of ``example["image"]`` (uint8 [H, W, C]), each flipped with
    probability 0.5, colour-jittered with probability `jitter_prob`, turned grey with probability
    `grayscale_prob` (3 channels only) and normalised -> float32 [count, h, w, C] under the key of
    `keys` at its place (a spec of count 0 gives no key)."""

    def one_view(image: np.ndarray, spec: ViewSpec, rng: np.random.Generator) -> np.ndarray:
        top, left, h, w = random_resized_crop_box(image.shape[0], image.shape[1], rng, spec.scale, ratio)
        x = _resize(image, (left, top, left + w, top + h), spec.size)
        return _normalise(_augment(x, rng, hflip, jitter_prob, jitter, grayscale_prob), mean, std)

    def transform(example: dict, rng: np.random.Generator) -> dict:
        image = _as_hwc(example["image"])
        out = dict(example)
        for spec, key in zip(views, keys):
            if spec.count:
                out[key] = np.stack([one_view(image, spec, rng) for _ in range(spec.count)])
        return out

    return transform


def clip_multi_view(views: tuple[ViewSpec, ...], keys: tuple[str, ...], mean=IMAGENET_MEAN, std=IMAGENET_STD,
                    ratio=(3 / 4, 4 / 3), hflip: bool = True, jitter_prob: float = 0.8, jitter=(0.4, 0.4, 0.2),
                    grayscale_prob: float = 0.2):
    """Spatio-temporal multi-crop of ``example["video"]`` (uint8 [T, H, W, C]): for each ViewSpec,
    `count` views, each a window of `spec.frames` consecutive frames at a uniformly drawn start, every
    frame cut by the view's one random resized crop box (as V-JEPA's clip crop) and augmented with
    the view's one draw of `multi_view`'s flip, colour jitter and grey -> float32 [count, frames, h,
    w, C] under the key of `keys` at its place (a spec of count 0 gives no key)."""

    def one_view(clip: np.ndarray, spec: ViewSpec, rng: np.random.Generator) -> np.ndarray:
        t = clip.shape[0]
        start = int(rng.integers(0, t - spec.frames + 1))
        top, left, h, w = random_resized_crop_box(clip.shape[1], clip.shape[2], rng, spec.scale, ratio)
        box = (left, top, left + w, top + h)
        x = np.stack([_resize(_as_hwc(f), box, spec.size) for f in clip[start:start + spec.frames]])
        return _normalise(_augment(x, rng, hflip, jitter_prob, jitter, grayscale_prob), mean, std)

    def transform(example: dict, rng: np.random.Generator) -> dict:
        clip = np.asarray(example["video"])
        out = dict(example)
        for spec, key in zip(views, keys):
            if spec.count:
                if spec.frames is None or not 0 < spec.frames <= clip.shape[0]:
                    raise InputError(f"clips of {clip.shape[0]} frames are shorter than the views' {spec.frames}")
                out[key] = np.stack([one_view(clip, spec, rng) for _ in range(spec.count)])
        return out

    return transform
