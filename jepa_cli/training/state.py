"""The train state pytree: params, EMA, optimizer state, update step, base RNG key."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    params: Any  # the objective's parameters (nested dict)
    ema: Any  # EMA of params[ema_spec.source] (of all params if source is None; {} without an EMA spec)
    opt_state: Any  # optax state
    step: jnp.ndarray  # int32 scalar: optimizer updates applied
    rng: jnp.ndarray  # uint32 [2]: base key; step keys are fold_in(rng, step)

    def as_dict(self) -> dict[str, Any]:
        return {"params": self.params, "ema": self.ema, "opt_state": self.opt_state, "step": self.step, "rng": self.rng}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainState":
        return cls(params=d["params"], ema=d["ema"], opt_state=d["opt_state"], step=d["step"], rng=d["rng"])


def init_state(objective, tx, seed_key: jnp.ndarray) -> TrainState:
    """Initial state from a uint32[2] key (jit-able; call under jit with out_shardings to init sharded)."""
    init_key, rng = jax.random.split(seed_key)
    return state_from_params(objective, tx, objective.init(init_key), rng)


def state_from_params(objective, tx, params, rng: jnp.ndarray) -> TrainState:
    """The state at update 0 around `params`: their EMA copy, the optimizer's initial state, `rng`
    (uint32 [2]) as the base key."""
    spec = objective.ema_spec
    ema = jax.tree.map(jnp.array, ema_source(params, spec)) if spec is not None else {}
    return TrainState(params=params, ema=ema, opt_state=tx.init(params), step=jnp.zeros([], jnp.int32), rng=rng)


def ema_source(params, spec):
    """The subtree the EMA averages: params[spec.source], or every parameter when source is None."""
    return params if spec.source is None else params[spec.source]
