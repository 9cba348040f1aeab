"""The toolkit from Python: a run's encoder and a dataset's arrays, in memory (docs/api.md).

    from jepa_cli import api

    run = api.load_run("runs/ijepa")            # the newest checkpoint, target (EMA) encoder
    test = api.load_dataset("digits-test.zarr")
    z = run.encode(test.inputs)                 # [N, D] float32: what `jepa encode-latents` writes

`Run.encode` is encode-latents' computation (evaluation/encode.py: the evaluation transform, the
encoder, the pooling, the same batches), so its numbers are the command's. Bad input raises
`InputError` (a subclass of `JepaError`) with the one-line message the commands print; nothing
here prints or exits.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np

from jepa_cli.errors import InputError, JepaError

__all__ = ["Dataset", "InputError", "JepaError", "Run", "load_dataset", "load_run"]


def _require(ok: bool, name: str, what: str, value: Any) -> None:
    """InputError `NAME must be WHAT, got VALUE` unless `ok`: an argument of the wrong type or value
    is refused in one line before it reaches code that would raise a traceback."""
    if not ok:
        scalar = isinstance(value, (str, bytes, int, float, np.generic, type(None)))
        shown = repr(value) if scalar else type(value).__name__
        raise InputError(f"{name} must be {what}, got {shown[:80]}")


def _path(value: Any, name: str) -> Path:
    """The argument `name` as a Path; InputError unless it is a str or an os.PathLike."""
    _require(isinstance(value, (str, os.PathLike)), name, "a path (a str or os.PathLike)", value)
    return Path(value)


def _integer(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class Run:
    """One checkpoint of a training (or imported) run, loaded once; `encode` embeds arrays with it.

    Attributes: `path`; `step` (the checkpoint's); `weights` ("target": the EMA encoder, as
    I-JEPA evaluates; "context": the online one), which `encode` uses; `config` (the resolved
    training configuration the checkpoint was saved with, a dict; `config["objective_config"]`
    holds the model); `params` (the checkpoint's weights as NumPy pytrees: `{"params": the trained
    parameters, e.g. {"encoder", "predictor"}, "ema": the target encoder or None}`);
    `encoder_params` (the tree `encode` uses); `notes` (what the commands would have warned about,
    e.g. a damaged newest checkpoint skipped for an older one)."""

    def __init__(self, encoder: Any, notes: list[str]):
        self._encoder = encoder  # evaluation.run_encoder.RunEncoder
        self._steps: dict[tuple[str, str], tuple[Any, Any]] = {}  # (layers, pool) -> jitted step, placed params
        self.path: Path = encoder.run_dir
        self.step: int = encoder.step
        self.weights: str = encoder.weights
        self.config: dict[str, Any] = encoder.config
        self.params: dict[str, Any] = encoder.host
        self.encoder_params: Any = encoder.params
        self.notes = notes

    @property
    def objective(self) -> str:
        """The objective's name (ijepa, vjepa, audio-jepa, ...)."""
        return str(self.config.get("objective") or getattr(self._encoder.objective, "name", "?"))

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, objective={self.objective!r}, step={self.step}, weights={self.weights!r})"

    def encode(self, x: Any, layers: str = "last", pool: str = "mean", batch_size: int = 128) -> np.ndarray:
        """Embeddings of the raw samples `x` (as a dataset's `inputs` holds them: images
        [N, H, W, C], clips [N, T, H, W, C], audio [N, samples]). Pixels follow the rule `jepa ingest`
        applies to arrays: uint8 as is, floats must lie in [0, 1] (round(v x 255)), so float pixels
        0-255 are refused rather than misread (docs/api.md).

        Each sample goes through the run's evaluation transform (resize and centre crop to the
        training size, normalisation) and the encoder. `pool` "mean": float32 [N, D] (the tokens
        averaged); "none": the tokens [N, T, D]. `layers` "last4": the last four blocks' outputs
        concatenated (D x 4). `batch_size` samples per step; as in encode-latents, a batch is at most
        N samples and the last one is padded. InputError for bad options, no samples, samples that
        hold NaN or inf, pixels outside their dtype's range, samples the encoder cannot take (images
        without a channel axis or of other channels than the run's), and embeddings that hold NaN or
        inf. Audio must be at the run's sample rate (`config["objective_config"]["sample_rate"]`)."""
        from jepa_cli.evaluation.encode import POOLS, check_finite_rows, encoded_batches, feature_shape, make_step
        from jepa_cli.evaluation.run_encoder import LAYERS

        _require(isinstance(layers, str) and layers in LAYERS, "layers", f"one of {', '.join(LAYERS)}", layers)
        _require(isinstance(pool, str) and pool in POOLS, "pool", f"one of {', '.join(POOLS)}", pool)
        _require(_integer(batch_size) and batch_size > 0, "batch_size", "a positive integer", batch_size)
        try:
            x = np.asarray(x)
        except (TypeError, ValueError) as exc:
            raise InputError(f"x is not an array of samples ({exc})") from None
        if x.dtype.kind not in "biuf" or x.ndim < 2:
            raise InputError(f"x must be a numeric array of samples [N, ...], got {x.dtype} of shape {list(x.shape)}")
        n = int(x.shape[0])
        if n == 0:
            raise InputError("x holds no samples")
        modality = tuple(getattr(self._encoder.objective, "modalities", ("image",)))[0]
        channels = self._encoder.objective_config.get("channels")
        if modality == "image" and x.ndim != 4:
            hint = " (add the channel axis: x[..., None])" if x.ndim == 3 and channels and int(channels) == 1 else ""
            raise InputError(f"x: images must be [N, H, W, {channels or 'C'}], got shape {list(x.shape)}{hint}")
        if modality == "image" and channels and x.shape[-1] != int(channels):
            raise InputError(f"x: images of {x.shape[-1]} channel(s), but {self.path} was trained on {channels} "
                             f"(x is [N, H, W, C])")
        x = _finite_samples(x)
        if modality in ("image", "video"):
            x = _pixels(x)
        if (layers, pool) not in self._steps:
            self._steps[layers, pool] = make_step(self._encoder.encode_fn(layers), self.encoder_params, pool)
        step, placed = self._steps[layers, pool]
        transform = self._encoder.transform()
        batch = min(int(batch_size), n)
        feature_shape(step, placed, x[:1], transform, batch, modality, "x")
        z = np.concatenate(list(encoded_batches(step, placed, x, transform, batch, modality)), axis=0)
        check_finite_rows(z, f"0..{n - 1} of x", f"{self.path} at step {self.step} ({self.weights} encoder)")
        return z


def _finite_samples(x: np.ndarray) -> np.ndarray:
    """`x`, refused when any sample holds NaN or inf (its embedding would be NaN, or garbage where the
    transform casts pixels to uint8), saying how many samples do."""
    if x.dtype.kind == "f":
        bad = int(np.count_nonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1)))
        if bad:
            raise InputError(f"x: {bad} of the {len(x)} samples hold NaN or inf")
    return x


def _pixels(x: np.ndarray) -> np.ndarray:
    """Images or clips as uint8, by the rule `jepa ingest` applies to arrays (docs/formats.md, "Pixel
    values": the dtype sets the scale; floats must lie in [0, 1]), so that `encode(x)` equals
    encode-latents on the dataset ingested from `x`."""
    from jepa_cli.data.pixels import to_uint8
    from jepa_cli.data.samples import BadSample

    try:
        return to_uint8(x, "x")
    except BadSample as exc:
        hint = ", or pass 0-255 pixels as uint8" if x.dtype.kind == "f" else ""
        raise InputError(f"{exc}{hint}") from None


def load_run(path: str | os.PathLike, step: int | None = None, weights: str = "target") -> Run:
    """The run at `path`, at checkpoint `step` (None: the newest that reads back), with its
    `weights` encoder ("target" or "context", as encode-latents --weights). InputError for a
    missing or damaged run, a step it does not hold, an objective without that encoder, and
    weights that hold NaN or inf."""
    from jepa_cli.evaluation.run_encoder import open_encoder
    from jepa_cli.training.encoder import WEIGHTS

    path = _path(path, "path")
    _require(step is None or (_integer(step) and step >= 0), "step", "a checkpoint step (an integer >= 0) or None",
             step)
    _require(isinstance(weights, str) and weights in WEIGHTS, "weights", f"one of {', '.join(WEIGHTS)}", weights)
    notes: list[str] = []
    encoder = open_encoder(path, None if step is None else int(step), weights, on_log=notes.append)
    return Run(encoder, notes)


@dataclasses.dataclass
class Dataset:
    """A dataset directory in memory: `inputs` (the samples, in their stored dtype), `labels`
    (int32 [N], or None for an unlabelled set) and `attributes` (the group's metadata:
    docs/formats.md)."""

    path: Path
    inputs: np.ndarray
    labels: np.ndarray | None
    attributes: dict[str, Any]

    @property
    def modality(self) -> str:
        return str(self.attributes.get("modality", "image"))

    @property
    def class_names(self) -> list[str]:
        return list(self.attributes.get("class_names") or [])

    def __len__(self) -> int:
        return int(self.inputs.shape[0])


def load_dataset(path: str | os.PathLike) -> Dataset:
    """The dataset at `path` (as `jepa ingest` or `jepa encode-latents` writes it). InputError for
    a missing path, something that is not a dataset (a mask file, a run), damaged arrays, and
    labels whose count differs from the samples' or that are not integers fitting int32."""
    from jepa_cli.data import store
    from jepa_cli.data.labels import int32_labels

    path = _path(path, "path")
    if not path.exists():
        raise InputError(f"{path}: no such dataset")
    attrs = store.read_attributes(path)
    if attrs.get("jepa_kind", "dataset") != "dataset" or not (path / "inputs").exists():
        raise InputError(f"{path}: not a dataset (a {attrs.get('jepa_kind', 'zarr group')} without an 'inputs' "
                         "array)")
    inputs = store.read_array(path / "inputs")
    labels = None
    if (path / "labels").exists():
        labels = int32_labels(store.read_array(path / "labels"), str(path))
        if labels.shape[:1] != inputs.shape[:1]:
            raise InputError(f"{path}: inputs has {inputs.shape[0]} samples but labels has {labels.shape[0]}")
    return Dataset(path, inputs, labels, attrs)
