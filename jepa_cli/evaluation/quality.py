"""`sigreg_quality`: a label-free figure of how far an encoder's features are from an isotropic Gaussian.

What is computed: the target (EMA) encoder's mean-pooled float32 features [N, D] (`jepa encode-latents`'
features: the objective's evaluation transform, the last layer, batches of 128 padded as it pads) of a
fixed set of examples, centred per dimension and divided by one global scale (`standardise`), then
SIGReg's Epps-Pulley statistic (objectives/sigreg.py `epps_pulley_sliced`) on NUM_SLICES unit
directions drawn once from the run's seed (`quality_directions`). The examples are the first
N = min(quality_batch, dataset size) of the training dataset, read once when training starts: they
are also trained on ("fixed", not held out); only the set and the directions must stay the same
for the figure of one step to compare with another's, or with a checkpoint's after the fact
(`quality_run`).

LeJEPA (Balestriero & LeCun 2025, Fig. 1) selects models by its training loss, prediction plus
SIGReg on the training views with new directions each step. Here the figure is of the frozen target
encoder, the encoder the probes and `encode-latents` use, so it applies to every JEPA objective,
trained with SIGReg or not (lejepa, which keeps no EMA: its one encoder). Low is well spread, of
order 1 for Gaussian features; a collapsed encoder scores high, of order N.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from jepa_cli.data.urls import location
from jepa_cli.errors import InputError

DIRECTIONS_STREAM = 0x51C  # folded into the run's seed: the directions' own stream, apart from init and masks
# A spread below this fraction of the features' root mean square counts as none (float32 rounding of
# constant features is about 1e-7 of them): scaled up, such noise would read as well spread.
RELATIVE_FLOOR = 1e-4


def standardise(features):
    """[N, D] features centred per dimension and divided by the root of their mean per-dimension
    variance, so that E|x|^2 = D as for N(0, I). One scale for all dimensions, not one each: scaling
    each to unit variance would blow dead dimensions up into noise and hide a dimensional collapse;
    the offset and the overall scale, which a linear probe ignores, are removed."""
    import jax.numpy as jnp

    x = jnp.asarray(features, jnp.float32)
    centred = x - jnp.mean(x, axis=0)
    spread = jnp.sqrt(jnp.mean(jnp.square(centred)))
    floor = RELATIVE_FLOOR * jnp.sqrt(jnp.mean(jnp.square(x)))
    return centred / jnp.maximum(jnp.maximum(spread, floor), jnp.finfo(jnp.float32).tiny)


def quality_directions(seed: int, dim: int):
    """[dim, NUM_SLICES] unit directions of the run with this seed: the same at every step."""
    import jax

    from jepa_cli.objectives.sigreg import random_directions

    return random_directions(jax.random.fold_in(jax.random.PRNGKey(seed), DIRECTIONS_STREAM), dim)


def quality_statistic(features, directions):
    """SIGReg's statistic (a scalar) of features [N, D] standardised, on directions [D, M]."""
    from jepa_cli.objectives.sigreg import epps_pulley_sliced

    return epps_pulley_sliced(standardise(features), directions)


def has_encoder(objective: Any) -> bool:
    """Whether the objective has an encoder to score (the JEPA objectives; not the generative ones)."""
    return callable(getattr(objective, "encode", None)) and not getattr(objective, "generative", False)


class QualitySignal:
    """The figure of an encoder's parameters on the first `num_examples` examples of `data`, read once.
    Calls return a device scalar without waiting for it (the trainer reads it with the step's metrics)."""

    def __init__(self, objective: Any, data: str | Path, num_examples: int, seed: int, image_size: Any = None):
        import jax

        from jepa_cli.data import store
        from jepa_cli.evaluation.encode import prepare_batch, pooled_features, source_attributes
        from jepa_cli.evaluation.online import ENCODE_BATCH

        modality = source_attributes(data).get("modality", "image")
        raw_array = store.open_array(location(data) / "inputs")
        self.n = min(int(num_examples), int(raw_array.shape[0]))
        raw = store.read(raw_array, slice(0, self.n))
        transform = objective.eval_transform(image_size)
        batch = min(ENCODE_BATCH, self.n)  # as encode_dataset pads
        self._batches = [prepare_batch(raw[a:a + batch], transform, batch, modality) for a in range(0, self.n, batch)]
        self._features = jax.jit(pooled_features(objective.encode, "mean"))
        self._statistic = jax.jit(quality_statistic)
        self._seed = seed
        self._directions = None

    def features(self, encoder_params: Any):
        """float32 [N, D] pooled features, on the device."""
        import jax.numpy as jnp

        return jnp.concatenate([self._features(encoder_params, x) for x in self._batches])[:self.n]

    def __call__(self, encoder_params: Any):
        features = self.features(encoder_params)
        if self._directions is None:
            self._directions = quality_directions(self._seed, features.shape[-1])
        return self._statistic(features, self._directions)


def training_quality(config: Any, objective: Any) -> QualitySignal | None:
    """The signal the trainer logs as `sigreg_quality`, or None: `quality_batch` 0, an objective
    without an encoder, or a multi-process run (its state spans processes; score its checkpoints
    with `quality_run`)."""
    import jax

    if not config.quality_batch or not has_encoder(objective) or jax.process_count() > 1:
        return None
    return QualitySignal(objective, config.data, config.quality_batch, config.seed,
                         config.objective_config.get("image_size"))


def quality_run(run_dir: str | Path, step: int | str | None = "all", data: str | Path | None = None,
                on_result: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """`sigreg_quality` of the target encoder of RUN's checkpoint `step` (None: the newest; "all":
    every one, oldest first) on the first `quality_batch` examples of `data` (None: the run's
    training dataset) with the run's directions (its seed): for the training dataset, at a logged
    step, the metrics.jsonl value (to float rounding). A run trained with `quality_batch` 0 is scored
    on the key's default. One {'step', 'sigreg_quality'} per checkpoint; `on_result(row)` as each is
    done."""
    from jepa_cli.training.encoder import select_encoder
    from jepa_cli.training.config import TrainConfig
    from jepa_cli.training.run import load_run
    from jepa_cli.training.runfiles import requested_steps

    run_dir = Path(run_dir)
    steps = requested_steps(run_dir, step)
    signal, rows = None, []
    for want in steps:
        config, objective, host, got = load_run(run_dir, want)
        if signal is None:
            if not has_encoder(objective):
                raise InputError(f"{run_dir}: objective {config.get('objective')!r} has no encoder to score")
            size = config.get("quality_batch") or TrainConfig.quality_batch
            image_size = (config.get("objective_config") or {}).get("image_size")
            signal = QualitySignal(objective, data or config["data"], size, int(config.get("seed") or 0), image_size)
        row = {"step": got, "sigreg_quality": float(signal(select_encoder(objective, host, "target", run_dir)))}
        rows.append(row)
        if on_result:
            on_result(row)
    return rows
