"""The grain input pipeline over a zarr v3 dataset (images, video, audio or latents).

source (rows via TensorStore) -> seeded shuffle, reshuffled every epoch -> repeat -> the objective's
per-example transform (seeded by the element's place in the stream) -> this process's share (its
contiguous rows of every global batch) -> per-process batch -> one global jax.Array per key
(jax.make_array_from_process_local_data). The global batches, and so a run's every number, do not
depend on how many processes read them.
The grain iterator's state is JSON and goes into every checkpoint, so resuming continues the stream.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np

from jepa_cli.data import store
from jepa_cli.data.files import check_regular_tree
from jepa_cli.data.urls import BucketPath, location
from jepa_cli.data.jsonvalues import json_value
from jepa_cli.errors import InputError

IN_MEMORY_BYTES = 256 << 20  # datasets up to this size are read into memory once


def _unreadable(path: str | Path, index: int, exc: BaseException) -> InputError:
    reason = " ".join(str(exc).split())[:200]
    return InputError(f"{path}: example {index} is unreadable, a chunk of 'inputs' is truncated or corrupt "
                      f"({reason}); ingest the dataset again")


def abstract_batch(path: str | Path, transform: Callable, global_batch: int, sharding: Any,
                   with_labels: bool = False) -> dict[str, Any]:
    """The ShapeDtypeStructs of one global batch (as DataLoader yields it), from one transformed
    example: lets the step be traced before any file is written."""
    source = ZarrSource(path, with_labels=with_labels, whole=False)
    example = transform(source[0], np.random.default_rng(0))
    out = {}
    for key, value in dict(example).items():
        value = np.asarray(value)
        if value.dtype.kind in "biuf":  # as DataLoader: other entries never reach the device
            out[key] = jax.ShapeDtypeStruct((int(global_batch),) + value.shape, value.dtype, sharding=sharding)
    return out


class ZarrSource:
    """A grain RandomAccessDataSource: element i is {MODALITY: inputs[i]} (the key is the dataset's
    modality: "image" uint8 [H, W, C], "audio", "video", "latent"), plus {"label": int32 scalar}
    when `with_labels`. Small datasets are read into memory once unless `whole` is False."""

    def __init__(self, path: str | Path, with_labels: bool = False, whole: bool = True):
        self.path = location(path)
        self.key = store.read_attributes(self.path).get("modality", "image")
        self.with_labels = with_labels
        self.whole = whole
        self._array = None
        self._labels = None
        self._opening = threading.Lock()
        meta = store.read_metadata(self.path / "inputs", "array")
        self._shape = tuple(meta["shape"])
        self._itemsize = np.dtype(meta["data_type"]).itemsize

    def __getstate__(self) -> dict[str, Any]:  # a copy in another process opens the arrays itself
        return {**self.__dict__, "_array": None, "_labels": None, "_opening": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _opening=threading.Lock())

    def _open(self):
        # grain's reader threads ask for elements at once: one opens, and the array is published
        # only after the labels, since a reader that finds it goes on to read a label
        if self._array is None:
            with self._opening:
                if self._array is None:
                    labels = (np.asarray(store.read_array(self.path / "labels"), np.int32) if self.with_labels
                              else None)
                    self._labels, self._array = labels, self._read_inputs()
        return self._array

    def _read_inputs(self):
        nbytes = int(np.prod(self._shape)) * self._itemsize
        if self.whole and nbytes <= IN_MEMORY_BYTES:
            return store.read_array(self.path / "inputs")
        import tensorstore as ts

        if not isinstance(self.path, BucketPath):
            check_regular_tree(self.path / "inputs")  # a chunk that is a named pipe would hang the read
        spec = store.zarr_spec(self.path / "inputs")
        spec["context"] = spec.get("context", {}) | {"cache_pool": {"total_bytes_limit": 256 << 20}}
        spec["recheck_cached_data"] = False
        return ts.open(spec, read=True).result()

    def __len__(self) -> int:
        return self._shape[0]

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        try:
            arr = self._open()
            row = arr[int(index)]
            if not isinstance(row, np.ndarray):
                row = row.read().result()
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 - TensorStore reports damaged chunks as ValueErrors and others
            raise _unreadable(self.path, index, exc) from None
        example = {self.key: np.asarray(row)}
        if self.with_labels:
            example["label"] = self._labels[int(index)]
        return example

    def __repr__(self) -> str:
        return f"ZarrSource({self.path})"


class DataLoader:
    """Global batches (dicts of jax.Arrays sharded by `sharding`) from the dataset, resumable."""

    def __init__(self, path: str | Path, transform: Callable, global_batch: int, seed: int, sharding: Any,
                 num_threads: int = 2, prefetch: int = 4, with_labels: bool = False):
        import grain

        self.global_batch = int(global_batch)
        pc, pi = jax.process_count(), jax.process_index()
        self.local_batch = self.global_batch // pc
        self.sharding = sharding
        self.source = ZarrSource(path, with_labels=with_labels)
        ds = grain.MapDataset.source(self.source).shuffle(seed=seed).repeat(None)
        # per-example randomness is keyed by the example's place in the global stream
        ds = ds.random_map(lambda ex, rng: dict(transform(ex, rng)), seed=seed + 1)
        if pc > 1:
            ds = _process_share(ds, self.global_batch, self.local_batch, pi)
        ds = ds.batch(self.local_batch, drop_remainder=True)
        self.dataset = ds.to_iter_dataset(grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch))
        self.iterator = iter(self.dataset)

    def get_state(self) -> dict[str, Any]:
        return json_value(self.iterator.get_state())

    def set_state(self, state: dict[str, Any]) -> None:
        """Moves the iterator to a position saved by get_state; InputError for one that does not fit
        this dataset (a checkpoint's data state edited or saved for another dataset)."""
        if state:
            try:
                self.iterator.set_state(state)
            except (KeyError, IndexError, ValueError, TypeError, OverflowError) as exc:
                raise InputError(f"{self.source.path}: the data position saved with the checkpoint "
                                 f"({json.dumps(state, default=str)[:80]}) does not fit this dataset "
                                 f"({type(exc).__name__}: {' '.join(str(exc).split())[:120]})") from None

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, jax.Array]:
        local = next(self.iterator)
        out = {}
        for key, value in local.items():
            value = np.asarray(value)
            if value.dtype.kind not in "biuf":
                continue
            global_shape = (self.global_batch,) + value.shape[1:]
            out[key] = jax.make_array_from_process_local_data(self.sharding, value, global_shape)
        return out


def _process_share(stream, global_batch: int, local_batch: int, process_index: int):
    """Process p's rows of every global batch: rows [p * L, (p + 1) * L) of batch b are elements
    b * G + p * L + j of the global stream. So the global batch (assembled in process order by
    make_array_from_process_local_data) holds the same examples in the same places, with the same
    per-example randomness, whatever the number of processes."""
    import grain

    def element(j: int):
        batch, row = divmod(int(j), local_batch)
        return stream[batch * global_batch + process_index * local_batch + row]

    return grain.MapDataset.range(len(stream) // (global_batch // local_batch)).map(element)
