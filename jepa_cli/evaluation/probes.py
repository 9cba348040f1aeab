"""`jepa probe linear|knn|attentive` on two feature datasets: the probe run on loaded features, its
progress in units the caller can count, and the result's fields."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from jepa_cli.errors import InputError
from jepa_cli.evaluation import features as feats

def probe_progress(probe: str, test_count: int, epochs: int) -> tuple[str, int, str]:
    """(title, total, unit) of the progress `probe_features` reports: the linear probe's fits (one per
    candidate weight decay on the held-out split, then the refit), k-NN's test rows, attentive's epochs."""
    if probe == "linear":
        from jepa_cli.evaluation.linear import WEIGHT_DECAYS  # JAX: loaded only for the probe that runs

        return "linear probe", len(WEIGHT_DECAYS) + 1, "fits"
    if probe == "knn":
        return "k-NN probe", test_count, "rows"
    return "attentive probe", epochs, "epochs"


def probe_features(probe: str, train: Any, test: Any, num_classes: int, *, k: int = 20, temperature: float = 0.07,
                   vote: str = "weighted", epochs: int = 20, batch_size: int | None = None, seed: int = 0,
                   on_advance: Callable[[int], None] = lambda n: None,
                   on_note: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Runs `probe` on loaded features (features.load_pair: `.x`, `.labels`); returns its output:
    top1, top5, predictions (int [N_test]) and the probe's own fields. `on_advance(n)` counts the
    units of `probe_progress`; `on_note` receives the fits begun and the epochs' losses."""
    if probe == "linear":
        from jepa_cli.evaluation.linear import linear_probe  # JAX: loaded only for the probe that runs

        fits_begun: list[str] = []

        def on_step(message: str) -> None:  # a fit is done when the next one begins
            if fits_begun:
                on_advance(1)
            fits_begun.append(message)
            if on_note:
                on_note(message)

        out = linear_probe(train.x, train.labels, test.x, test.labels, num_classes, seed=seed, on_step=on_step)
        on_advance(1)
        return out
    if probe == "knn":
        from jepa_cli.evaluation.knn import knn_probe  # JAX: loaded only for the probe that runs

        return knn_probe(train.x, train.labels, test.x, test.labels, num_classes, k=k, temperature=temperature,
                         vote=vote, batch_size=batch_size, on_batch=on_advance)
    from jepa_cli.evaluation.attentive import BATCH_SIZE, attentive_probe  # Flax: only for the probe that runs

    def on_epoch(epoch: int, loss: float) -> None:
        on_advance(1)
        if on_note:
            on_note(f"epoch {epoch}: loss {loss:.4f}")

    try:
        return attentive_probe(train.x, train.labels, test.x, test.labels, num_classes, epochs=epochs,
                               batch_size=batch_size or BATCH_SIZE, seed=seed, on_epoch=on_epoch)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def probe_result(probe: str, out: dict[str, Any], train: Any, test: Any, num_classes: int, paths: tuple[str, str],
                 raw: bool, mismatch: str | None, per_class: bool, seconds: float) -> dict[str, Any]:
    """The result of one probe (its --json): accuracies first, then the datasets, the encoder that
    wrote them and the probe's own fields; per-class top-1 when asked."""
    out = dict(out)
    predictions: np.ndarray = out.pop("predictions")
    result = {"probe": probe, "top1": out.pop("top1"), "top5": out.pop("top5"), "n_train": train.n, "n_test": test.n,
              "num_classes": num_classes, "dim": int(train.x.shape[-1]), "raw": raw, "train": paths[0],
              "test": paths[1], "encoder": feats.encoder_of(train.attrs, raw), "encoding_mismatch": mismatch,
              **out, "seconds": round(seconds, 3)}
    if per_class:
        result["per_class"] = feats.per_class_accuracy(test.labels, predictions, num_classes,
                                                       train.class_names or test.class_names)
    return result
