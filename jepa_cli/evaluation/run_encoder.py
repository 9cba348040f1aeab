"""The encoder of one checkpoint of a training run, as encode-latents, fd, the probes and the Python
API (jepa_cli.api) use it.

`open_encoder(run_dir, step, weights)` loads the checkpoint (`jepa_cli.training.run.load_run`) and
picks the target (EMA) or context encoder (`select_encoder`), refusing weights that hold NaN or
inf; the `RunEncoder` it returns gives the objective's encode function and evaluation transform.
`check_channels` and `check_sample_rate` refuse a dataset the run was not trained on.
`encode_run(run_dir, source, output, ...)` (`jepa encode-latents`) encodes a dataset with it
through `evaluation.encode.encode_dataset`, recording the run, step and weights as provenance.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable

from jepa_cli.data import atomic, store
from jepa_cli.data.jsonvalues import json_value
from jepa_cli.data.urls import location
from jepa_cli.errors import InputError
from jepa_cli.evaluation.encode import POOLS, encode_dataset, source_attributes
from jepa_cli.training.encoder import WEIGHTS, select_encoder

LAYERS = {"last": 1, "last4": 4}


def _check_finite(params: Any, what: str) -> None:
    """InputError naming the first parameter that holds NaN or inf (a diverged run's weights): every
    embedding would be NaN, so nothing is encoded."""
    import jax

    from jepa_cli.models.template import first_non_finite

    found = first_non_finite(params)
    if found is not None:
        path, bad, size = found
        raise InputError(f"{what} holds {bad} non-finite value(s) (NaN or inf) of {size} in "
                         f"{jax.tree_util.keystr(path)}; its embeddings would be NaN (a diverged run? pick an "
                         "earlier --step)")


def check_channels(source: str | os.PathLike, attrs: dict[str, Any], channels: int | None, run_dir: Path) -> None:
    """Images `[N, H, W, C]` must have the channels the run's encoder was trained on."""
    if channels is None or attrs.get("layout") != "NHWC" or not (location(source) / "inputs").exists():
        return
    found = int(store.open_array(location(source) / "inputs").shape[-1])
    if found != int(channels):
        raise InputError(f"{source}: images have {found} channel(s), but {run_dir} was trained on {channels} "
                         f"(ingest it again with --channels {channels})")


def check_sample_rate(source, attrs: dict[str, Any], rate: int | None, run_dir: Path) -> None:
    """Audio must be at the sample rate the run's front-end was built for."""
    if rate is None or attrs.get("modality") != "audio":
        return
    if int(attrs.get("sample_rate") or 0) != int(rate):
        raise InputError(f"{source}: audio at {attrs.get('sample_rate')} Hz, but {run_dir} was trained at {rate} Hz "
                         f"(ingest it again with --sample-rate {rate})")


@dataclasses.dataclass
class RunEncoder:
    """The encoder of one checkpoint of a run, as encode-latents uses it (`open_encoder`)."""

    run_dir: Path
    config: dict[str, Any]  # the resolved training configuration the checkpoint was saved with
    objective: Any
    host: dict[str, Any]  # the checkpoint's {'params', 'ema'} as NumPy pytrees
    step: int
    weights: str  # "target" (the EMA) or "context"
    params: Any  # the chosen encoder's parameters

    @property
    def objective_config(self) -> dict[str, Any]:
        return (self.config.get("objective_config") if isinstance(self.config, dict) else None) or {}

    def encode_fn(self, layers: str) -> Callable:
        """encode_fn(params, images) -> tokens [B, T, D x layers] of the last `layers` blocks."""
        if layers not in LAYERS:
            raise InputError(f"--layers must be one of {', '.join(LAYERS)}, got {layers!r}")
        last_layers = LAYERS[layers]
        objective = self.objective

        def encode_fn(p, images):
            return objective.encode(p, images, last_layers=last_layers)

        return encode_fn

    def transform(self) -> Callable:
        """The objective's evaluation transform at the training size."""
        return self.objective.eval_transform(self.objective_config.get("image_size"))


def open_encoder(run_dir: str | os.PathLike, step: int | None = None, weights: str = "target",
                 on_log: Callable[[str], None] | None = None, load_run: Callable | None = None) -> RunEncoder:
    """The `weights` encoder of RUN's checkpoint `step` (None: the newest that reads back; each
    newer, damaged one is reported through `on_log`). InputError for a missing run, an objective
    without that encoder, and weights that hold NaN or inf."""
    log = on_log or (lambda message: None)
    if weights not in WEIGHTS:
        raise InputError(f"--weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(f"{run_dir}: no such run directory")
    if load_run is None:
        from jepa_cli.training.run import load_run
    config, objective, host, step = load_run(run_dir, step, on_fallback=lambda _step, message: log(message))
    params = select_encoder(objective, host, weights, run_dir)
    _check_finite(params, f"{run_dir}: the {weights} encoder at step {step}")
    return RunEncoder(run_dir, config, objective, host, int(step), weights, params)


def encode_run(run_dir: str | os.PathLike, source: str | os.PathLike, output: str | os.PathLike, *,
               step: int | None = None, weights: str = "target", pool: str = "mean", layers: str = "last",
               batch_size: int = 128, mesh: str | None = "data=-1,fsdp=1", force: bool = False,
               on_progress: Callable[[int], None] | None = None,
               on_start: Callable[[int, int], None] | None = None,
               on_log: Callable[[str], None] | None = None,
               load_run: Callable | None = None) -> dict[str, Any]:
    """Encodes `source` with the encoder of a training run's checkpoint; returns a summary.

    `on_log(message)` reports what the user should know: a damaged newest checkpoint skipped for
    an older one, a partial output discarded, a damaged progress file recomputed."""
    log = on_log or (lambda message: None)
    if layers not in LAYERS:
        raise InputError(f"--layers must be one of {', '.join(LAYERS)}, got {layers!r}")
    if pool not in POOLS:
        raise InputError(f"--pool must be one of {', '.join(POOLS)}, got {pool!r}")
    atomic.check_output(output, force, "dataset", [source, run_dir])  # fail before loading anything
    source_attrs = source_attributes(source)  # before loading the run: a wrong input fails at once
    from jepa_cli.training.bucket_run import readable_run

    shown = str(location(run_dir).resolve())  # what the output records as its run: a folder or a bucket URL
    with readable_run(run_dir, step) as folder:
        encoder = open_encoder(folder, step, weights, log, load_run)
        config, objective, step, encoder_params = encoder.config, encoder.objective, encoder.step, encoder.params
        from jepa_cli.evaluation.features import check_modality_pair

        check_modality_pair(source, source_attrs.get("modality", "image"), objective, run_dir)
        encode_fn = encoder.encode_fn(layers)
        objective_config = encoder.objective_config
        check_channels(source, source_attrs, objective_config.get("channels"), run_dir)
        check_sample_rate(source, source_attrs, objective_config.get("sample_rate"), run_dir)
        transform = encoder.transform()
        mesh_obj = None
        if mesh:
            from jepa_cli.training.mesh import make_mesh

            mesh_obj = make_mesh(mesh)
        from jepa_cli.training.run import params_sha256

        to_config = getattr(objective, "to_config", None)
        model = to_config() if callable(to_config) else objective_config
        provenance = {
            "run": shown,
            "step": int(step),
            "weights": weights,
            "objective": (config or {}).get("objective", getattr(objective, "name", None)),
            "model": json_value(model),
            "source": str(location(source).resolve()),
            "pool": pool,
            "layers": layers,
            "encoder_sha256": params_sha256(encoder_params),
        }
        spec = getattr(objective, "ema_spec", None)
        if weights == "target" and spec is not None and spec.source is not None:
            from jepa_cli.training.ema import kept_weight

            provenance["init_weight"] = kept_weight(spec.momentum, int(step))  # of the random init, in the target
        job = {"run": provenance["run"], "step": provenance["step"], "weights": weights, "layers": layers,
               "encoder_sha256": provenance["encoder_sha256"]}
        summary = encode_dataset(source, output, encode_fn, encoder_params, transform, pool=pool,
                                 batch_size=batch_size, mesh=mesh_obj, job=job,
                                 attributes={"provenance": provenance, "pool": pool, "layers": layers},
                                 force=force, on_progress=on_progress, on_start=on_start, on_log=log,
                                 encoder_name=f"{run_dir} at step {step} ({weights} encoder)")
        return summary | {"run": provenance["run"], "step": provenance["step"], "weights": weights, "layers": layers}
