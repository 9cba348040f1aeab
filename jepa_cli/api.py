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
        [N, H, W, C] uint8 or float, clips [N, T, H, W, C], audio [N, samples]).

        Each sample goes through the run's evaluation transform (resize and centre crop to the
        training size, normalisation) and the encoder. `pool` "mean": float32 [N, D] (the tokens
        averaged); "none": the tokens [N, T, D]. `layers` "last4": the last four blocks' outputs
        concatenated (D x 4). `batch_size` samples per step; as in encode-latents, a batch is at most
        N samples and the last one is padded. InputError for bad options, no samples, samples the
        encoder cannot take (images of other channels than the run's), and embeddings that hold NaN
        or inf. Audio must be at the run's sample rate (`config["objective_config"]["sample_rate"]`)."""
        from jepa_cli.evaluation.encode import POOLS, check_finite_rows, encoded_batches, feature_shape, make_step
        from jepa_cli.evaluation.run_encoder import LAYERS

        if layers not in LAYERS:
            raise InputError(f"layers must be one of {', '.join(LAYERS)}, got {layers!r}")
        if pool not in POOLS:
            raise InputError(f"pool must be one of {', '.join(POOLS)}, got {pool!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
            raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")
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
        if modality == "image" and x.ndim == 4 and channels and x.shape[-1] != int(channels):
            raise InputError(f"x: images of {x.shape[-1]} channel(s), but {self.path} was trained on {channels} "
                             f"(x is [N, H, W, C])")
        if (layers, pool) not in self._steps:
            self._steps[layers, pool] = make_step(self._encoder.encode_fn(layers), self.encoder_params, pool)
        step, placed = self._steps[layers, pool]
        transform = self._encoder.transform()
        batch = min(int(batch_size), n)
        feature_shape(step, placed, x[:1], transform, batch, modality, "x")
        z = np.concatenate(list(encoded_batches(step, placed, x, transform, batch, modality)), axis=0)
        check_finite_rows(z, f"0..{n - 1} of x", f"{self.path} at step {self.step} ({self.weights} encoder)")
        return z


def load_run(path: str | os.PathLike, step: int | None = None, weights: str = "target") -> Run:
    """The run at `path`, at checkpoint `step` (None: the newest that reads back), with its
    `weights` encoder ("target" or "context", as encode-latents --weights). InputError for a
    missing or damaged run, a step it does not hold, an objective without that encoder, and
    weights that hold NaN or inf."""
    from jepa_cli.evaluation.run_encoder import open_encoder

    if step is not None and (isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0):
        raise InputError(f"step must be a checkpoint step (an integer >= 0) or None, got {step!r}")
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
    labels whose count differs from the samples'."""
    from jepa_cli.data import store

    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such dataset")
    attrs = store.read_attributes(path)
    if attrs.get("jepa_kind", "dataset") != "dataset" or not (path / "inputs").exists():
        raise InputError(f"{path}: not a dataset (a {attrs.get('jepa_kind', 'zarr group')} without an 'inputs' "
                         "array)")
    inputs = store.read_array(path / "inputs")
    labels = None
    if (path / "labels").exists():
        labels = np.asarray(store.read_array(path / "labels")).astype(np.int32)
        if labels.shape[:1] != inputs.shape[:1]:
            raise InputError(f"{path}: inputs has {inputs.shape[0]} samples but labels has {labels.shape[0]}")
    return Dataset(path, inputs, labels, attrs)
