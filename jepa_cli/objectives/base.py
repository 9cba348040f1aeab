"""The Objective seam between what is learned (objectives) and the mechanics (trainer).

See docs/architecture.md. Params cross the seam only as nested dicts of arrays.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from jepa_cli.models import ModuleTemplate
from jepa_cli.models.vit import gather_tokens
from jepa_cli.objectives import telemetry

Params = dict[str, Any]
Transform = Callable[[dict, np.random.Generator], dict]


@dataclasses.dataclass(frozen=True)
class EMASpec:
    """The trainer keeps ``ema = params[source]`` (copied at init) and after every optimizer update
    sets ``ema = m * ema + (1 - m) * params[source]`` with ``m = momentum(update_step)``.
    ``source`` None averages the whole parameter tree (the generative objectives)."""

    source: str | None
    momentum: Callable[[Any], jax.Array]


@runtime_checkable
class Objective(Protocol):
    """The contract of docs/architecture.md. Optional extras the trainer looks for with getattr:
    ``to_config() -> dict`` (JSON-able, round-trips through make_objective) and
    ``with_total_updates(n) -> Objective`` (the same objective told the run length) and
    ``fit_to_data(path) -> Objective`` (the same objective with statistics of the training set at
    `path` among its options, so that run.json records them: Audio-JEPA's spec_norm "dataset")."""

    def init(self, key: jax.Array) -> Params: ...

    @property
    def ema_spec(self) -> EMASpec | None: ...

    def loss(
        self, params: Params, ema: Params | None, batch: dict, key: jax.Array, step: jax.Array
    ) -> tuple[jax.Array, dict[str, jax.Array]]: ...

    def train_transform(self, image_size, on_device: bool = False) -> Transform:
        """The per-example training transform. `on_device` (option `device_normalise`): where the
        inputs are pixels, leave the float normalisation to the train step, as ``transform.device``
        (data/transforms.py DeviceNormalise); other objectives return their usual transform."""
        ...

    def eval_transform(self, image_size) -> Transform: ...

    def encode(self, encoder_params: Params, images: jax.Array, last_layers: int = 1) -> jax.Array: ...

    def weight_decay_mask(self, params: Params) -> Any: ...


def decay_matrices_only(params: Params, excluded: tuple[str, ...] = ("bias",)) -> Any:
    """The official JEPA codes' AdamW parameter groups as a pytree of bools: True (decayed) for
    every leaf but biases (leaves named in `excluded`) and 1-D leaves (LayerNorm scales); the
    mask tokens, which are 3-D, are decayed as in the official code. An S5 layer's (under `ssm`)
    B is not decayed either (models/s5.py NO_DECAY), nor its eigenvalues and log steps (1-D)."""
    from jepa_cli.models.s5 import NO_DECAY

    def decay(path, leaf):
        names = [getattr(k, "key", getattr(k, "name", None)) for k in path[-2:]]
        if names[-1] in NO_DECAY and names[0] == "ssm":
            return False
        return not (names[-1] in excluded or len(np.shape(leaf)) <= 1)

    return jax.tree_util.tree_map_with_path(decay, params)


class EncoderPredictorObjective:
    """What the JEPA objectives (I-JEPA, V-JEPA, Audio-JEPA) share: params {"encoder", "predictor"}
    from the subclass's two ModuleTemplates (`_encoder`, `_predictor`), the options' round trip
    through `config` (a dataclass with to_dict and a total_updates field), and the official
    weight-decay groups."""

    config: Any
    model_config: Any  # builds the modules: .encoder(rngs), .predictor(rngs)

    # the modules' templates are built on first use: validating options (the trainer builds the
    # objective once per option the dataset implies) never traces a model
    @functools.cached_property
    def _encoder(self) -> ModuleTemplate:
        return ModuleTemplate(self.model_config.encoder)

    @functools.cached_property
    def _predictor(self) -> ModuleTemplate:
        return ModuleTemplate(self.model_config.predictor)

    def to_config(self) -> dict:
        return self.config.to_dict()

    def with_total_updates(self, total_updates: float):
        return type(self)(dataclasses.replace(self.config, total_updates=total_updates))

    def init(self, key) -> Params:
        k_enc, k_pred = jax.random.split(key)
        return {"encoder": self._encoder.init(k_enc), "predictor": self._predictor.init(k_pred)}

    def param_shapes(self) -> Params:
        """{"encoder", "predictor"} of jax.ShapeDtypeStruct, without allocating anything."""
        return {"encoder": self._encoder.shapes(), "predictor": self._predictor.shapes()}

    def encoder(self, encoder_params: Params):
        return self._encoder.merge(encoder_params)

    def predictor(self, predictor_params: Params):
        return self._predictor.merge(predictor_params)

    def weight_decay_mask(self, params: Params) -> Any:
        """True where AdamW decays: not biases, not 1-D leaves; the mask tokens are."""
        return decay_matrices_only(params)

    def sample_masks(self, key, batch_size: int):
        """The MaskSet of one batch from the config's mask_config (jepa_cli.masks.sample)."""
        from jepa_cli import masks

        return masks.sample(key, self.config.mask_config, batch_size)

    def masked_prediction(self, params: Params, ema: Params, inputs, masks, key, prediction_loss: Callable,
                          target_norm: Callable | None = None, target_token_axes: tuple[int, ...] = (1, 2)):
        """(loss, aux) of one JEPA step on `inputs` [B, ...] with the batch's MaskSet `masks`: the
        target encoder (the EMA `ema`, never differentiated) on the whole input, its tokens h_full
        [B, N, D] through `target_norm` when given, gathered at the targets [B, M, T, D]; the context
        encoder on the context tokens [B, C, K, D]; the predictor at the targets. The loss is
        `prediction_loss(predictions, targets, target_valid)` with the config's anti-collapse terms on
        the pooled context features, SIGReg's on the samples its `sigreg_on` names
        (telemetry.with_anticollapse, telemetry.sigreg_samples); aux adds the collapse metrics and the
        mean counts of context tokens and of target tokens (target_valid summed over
        `target_token_axes`)."""
        target_encoder = self._encoder.merge(jax.lax.stop_gradient(ema))
        h_full = jax.lax.stop_gradient(target_encoder(inputs).astype(jnp.float32))  # [B, N, D]
        h = gather_tokens(target_norm(h_full) if target_norm else h_full, masks.target_index)  # [B, M, T, D]
        encoder = self._encoder.merge(params["encoder"])
        predictor = self._predictor.merge(params["predictor"])
        z_ctx = encoder(inputs, masks.context_index, masks.context_valid)  # [B, C, K, D]
        z = predictor(z_ctx, masks.context_index, masks.context_valid, masks.target_index, masks.target_valid)
        pooled = telemetry.masked_mean_pool(z_ctx, masks.context_valid).mean(axis=1)  # [B, D]
        rows, valid = telemetry.sigreg_samples(self.config.sigreg_on, pooled, z_ctx, masks.context_valid, z,
                                               masks.target_valid)
        value, regularisers = telemetry.with_anticollapse(prediction_loss(z, h, masks.target_valid), pooled,
                                                          self.config, key, rows, valid)
        aux = {
            "loss": value,
            **regularisers,
            **telemetry.collapse_metrics(pooled, h_full.mean(axis=1)),
            "context_tokens": jnp.mean(jnp.sum(masks.context_valid, axis=-1).astype(jnp.float32)),
            "target_tokens": jnp.mean(jnp.sum(masks.target_valid, axis=target_token_axes).astype(jnp.float32)),
        }
        return value, aux
