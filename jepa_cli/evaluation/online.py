"""The k-NN probe inside `jepa train` (`--probe-every N --probe-data TRAIN.zarr,TEST.zarr`).

Every N updates the trainer hands the target (EMA) encoder's parameters to an `OnlineProbe`, which
encodes both labelled datasets exactly as `jepa encode-latents` does (the objective's evaluation
transform, mean-pooled float32 features of the last layer) and scores TEST with `knn_probe` as
`jepa probe knn` does (cosine, DINO's temperature-weighted vote). So the curve in metrics.jsonl
(`knn_top1`, `knn_top5`) equals `jepa probe knn` on that checkpoint's embeddings, and shows whether
the representation improves, not only whether the loss falls.

Both datasets are read once and kept in memory after the transform: use a few thousand samples
(a held-out slice from `jepa ingest --limit`), not the full training set.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jepa_cli.data import store
from jepa_cli.data.labels import int32_labels
from jepa_cli.data.urls import BucketPath, location
from jepa_cli.errors import InputError

ENCODE_BATCH = 128  # encode-latents' default --batch-size: the same padding, the same programs


def parse_probe_data(value: str | None) -> tuple[Path | BucketPath, Path | BucketPath]:
    """'TRAIN.zarr,TEST.zarr' -> the two paths; InputError for anything else."""
    parts = [p.strip() for p in (value or "").split(",")]
    if len(parts) != 2 or not all(parts):
        raise InputError(f"--probe-data must be TRAIN.zarr,TEST.zarr (two labelled datasets), got {value!r}")
    return location(parts[0]), location(parts[1])


def training_probe(config: Any, objective: Any, abstract_state: Any, out: Path) -> Callable[[Any], dict[str, float]]:
    """The probe `jepa train` hands the trainer (training/loop.py `train(make_probe=...)`): a function
    of a TrainState that scores its target (EMA) encoder, as I-JEPA evaluates, on `config.probe_data`
    with `config.probe_k` neighbours, and adds the seconds that took (`probe_seconds`). The datasets
    are read and the encoder traced on `abstract_state` here, before the trainer writes anything."""
    probe = OnlineProbe(objective, *parse_probe_data(config.probe_data), config.probe_k,
                        config.objective_config.get("image_size"), config.objective_config.get("channels"))
    probe.check(_target_encoder(objective, abstract_state, out))

    def score(state: Any) -> dict[str, float]:
        start = time.perf_counter()
        scores = probe(_target_encoder(objective, state, out))
        return {**scores, "probe_seconds": time.perf_counter() - start}

    return score


def _target_encoder(objective: Any, state: Any, out: Path) -> Any:
    """The parameters the training-time probe encodes with: the target (EMA) encoder."""
    from jepa_cli.training.encoder import select_encoder

    return select_encoder(objective, {"params": state.params, "ema": state.ema}, "target", out)


class OnlineProbe:
    """k-NN top-1/top-5 of an encoder's features on two labelled datasets, read once.

    `objective` supplies `encode(params, images)` and `eval_transform(image_size)`; `channels` is
    the run's (images of another channel count are refused up front)."""

    def __init__(self, objective: Any, train_path: str | Path, test_path: str | Path, k: int = 20,
                 image_size: Any = None, channels: int | None = None, what: str = "--probe-data"):
        import jax

        from jepa_cli.evaluation.encode import prepare_batch, pooled_features, source_attributes
        from jepa_cli.evaluation.features import check_modality_pair
        from jepa_cli.evaluation.run_encoder import check_channels

        if not callable(getattr(objective, "encode", None)):
            raise InputError(f"objective {getattr(objective, 'name', '?')!r} has no encoder to probe")
        train_path, test_path = location(train_path), location(test_path)
        transform = objective.eval_transform(image_size)
        sets = []
        for path in (train_path, test_path):
            if not path.exists():
                raise InputError(f"{what}: {path}: no such dataset")
            attrs = source_attributes(path)
            check_modality_pair(path, attrs.get("modality", "image"), objective,
                                None if what == "--probe-data" else what)
            if not (path / "labels").exists():
                raise InputError(f"{what}: {path}: has no labels; a probe needs a labelled dataset")
            check_channels(path, attrs, channels, Path("the run"))
            raw = store.read_array(path / "inputs")
            labels = int32_labels(store.read_array(path / "labels"), f"{what}: {path}")
            if len(raw) == 0 or len(raw) != len(labels):
                raise InputError(f"{what}: {path}: {len(raw)} samples and {len(labels)} labels")
            modality = attrs.get("modality", "image")
            batch = min(ENCODE_BATCH, len(raw))  # as encode_dataset pads
            batches = [prepare_batch(raw[a:a + batch], transform, batch, modality) for a in range(0, len(raw), batch)]
            sets.append((batches, len(raw), labels, list(attrs.get("class_names") or [])))
        (self._train, n_train, self.train_labels, names), (self._test, _, self.test_labels, _) = sets
        if n_train < k:
            raise InputError(f"{what}: {train_path}: {n_train} samples, fewer than the k-NN probe's k={k}: pass "
                             f"--probe-k {n_train} or fewer, or a larger training set")
        if len(np.unique(self.train_labels)) < 2:
            raise InputError(f"{what}: {train_path}: a probe needs at least two classes")
        self.num_classes = max(int(max(self.train_labels.max(), self.test_labels.max())) + 1, len(names))
        self.k = k
        self._features = jax.jit(pooled_features(objective.encode, "mean"))
        self._counts = (n_train, len(self.test_labels))

    def check(self, encoder_params: Any) -> None:
        """Traces the encoder on abstract values: a sample shape the encoder cannot take fails here,
        before training starts, as an InputError."""
        import jax

        x = self._train[0]
        try:
            jax.eval_shape(self._features, encoder_params, jax.ShapeDtypeStruct(x.shape, x.dtype))
        except Exception as exc:  # noqa: BLE001 - a wrong sample shape is the user's input
            raise InputError(f"the encoder cannot take the probe's samples of shape {list(x.shape[1:])} "
                             f"({type(exc).__name__}: {' '.join(str(exc).split())[:160]})") from None

    def features(self, encoder_params: Any, which: str) -> np.ndarray:
        """float32 [N, D] features of the train or test set."""
        batches, n = (self._train, self._counts[0]) if which == "train" else (self._test, self._counts[1])
        return np.concatenate([np.asarray(self._features(encoder_params, x)) for x in batches])[:n]

    def __call__(self, encoder_params: Any) -> dict[str, float]:
        """{'knn_top1', 'knn_top5'} (fractions) of the k-NN probe on these parameters' features."""
        from jepa_cli.evaluation.knn import knn_probe

        out = knn_probe(self.features(encoder_params, "train"), self.train_labels,
                        self.features(encoder_params, "test"), self.test_labels, self.num_classes, k=self.k)
        return {"knn_top1": out["top1"], "knn_top5": out["top5"]}


def probe_run(run_dir: str | Path, train: str | Path, test: str | Path, kind: str = "knn", step: int | str | None = None,
              k: int = 20, temperature: float = 0.07, vote: str = "weighted", seed: int = 0,
              on_result: Any = None) -> list[dict[str, Any]]:
    """`jepa probe knn|linear TRAIN TEST --run RUN --step N|all`: the probe of the target encoder
    of RUN's checkpoint `step` (None: the latest; "all": every one, oldest first) on the datasets
    TRAIN and TEST, encoded as `jepa encode-latents` would. One {'step', 'top1', 'top5', ...} per
    checkpoint; `on_result(row)` is called as each is done. A checkpoint's k-NN equals the
    training-time probe's `knn_top1` at that step for the same datasets and k."""
    from jepa_cli.training.bucket_run import readable_run
    from jepa_cli.training.runfiles import requested_steps

    if kind not in ("knn", "linear"):
        raise InputError(f"--run probes with knn or linear, not {kind!r}")
    with readable_run(run_dir, step) as folder:
        return _probe_checkpoints(folder, str(location(run_dir)), requested_steps(folder, step), train, test, kind, k,
                                  temperature, vote, seed, on_result)


def _probe_checkpoints(run_dir: Path, shown: str, steps: list[int | None], train: str | Path, test: str | Path,
                       kind: str, k: int, temperature: float, vote: str, seed: int,
                       on_result: Any) -> list[dict[str, Any]]:
    """probe_run's rows for the checkpoints `steps` of the run in the local folder `run_dir`, named `shown`."""
    from jepa_cli.evaluation.knn import knn_probe
    from jepa_cli.evaluation.linear import linear_probe
    from jepa_cli.training.encoder import select_encoder
    from jepa_cli.training.run import load_run

    probe, rows = None, []
    for want in steps:
        config, objective, host, got = load_run(run_dir, want)
        if probe is None:
            model = config.get("objective_config") or {}
            # k=1: knn_probe lowers a k above TRAIN's size itself, and the command says so
            probe = OnlineProbe(objective, train, test, 1, model.get("image_size"), model.get("channels"),
                                what=shown)
        encoder = select_encoder(objective, host, "target", run_dir)
        x_train, x_test = probe.features(encoder, "train"), probe.features(encoder, "test")
        if kind == "knn":
            out = knn_probe(x_train, probe.train_labels, x_test, probe.test_labels, probe.num_classes, k=k,
                            temperature=temperature, vote=vote)
        else:
            out = linear_probe(x_train, probe.train_labels, x_test, probe.test_labels, probe.num_classes, seed=seed)
        out.pop("predictions")
        row = {"step": got, **out}
        rows.append(row)
        if on_result:
            on_result(row)
    return rows
