"""One jitted train step: loss and gradients (optionally accumulated over micro-batches), one AdamW
update, the EMA update, in-step non-finite detection, with explicit shardings and the state donated."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from jepa_cli.training.state import TrainState, ema_source


def make_step_fn(objective, tx: optax.GradientTransformation, lr_fn: Callable, wd_fn: Callable,
                 momentum_fn: Callable | None, grad_accum: int = 1, on_device: Callable | None = None) -> Callable:
    """The (unjitted) step: (state, batch) -> (state, metrics dict of scalars). `on_device`: the
    part of the training transform that runs here, first (the batch's uint8 pixels normalised)."""
    spec = objective.ema_spec
    k = int(grad_accum)

    def loss_fn(params, ema, batch, key, step):
        loss, aux = objective.loss(params, ema, batch, key, step)
        return loss, aux

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def step_fn(state: TrainState, batch: dict[str, Any]):
        if on_device is not None:
            batch = on_device(batch)
        key = jax.random.fold_in(state.rng, state.step)
        if k == 1:
            (loss, aux), grads = grad_fn(state.params, state.ema, batch, key, state.step)
        else:
            # Row r of micro-batch i is row r*k + i of the batch: each device keeps its own rows.
            micro = jax.tree.map(lambda x: jnp.moveaxis(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 1, 0), batch)

            def body(carry, xs):
                i, mb = xs
                (l, a), g = grad_fn(state.params, state.ema, mb, jax.random.fold_in(key, i), state.step)
                acc_l, acc_a, acc_g = carry
                return (acc_l + l, jax.tree.map(jnp.add, acc_a, a), jax.tree.map(jnp.add, acc_g, g)), None

            first = jax.tree.map(lambda x: x[0], micro)
            l_shape, a_shape = jax.eval_shape(lambda: loss_fn(state.params, state.ema, first, key, state.step))
            zeros = lambda t: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), t)  # noqa: E731
            init = (jnp.zeros(l_shape.shape, l_shape.dtype), zeros(a_shape), jax.tree.map(jnp.zeros_like, state.params))
            (loss, aux, grads), _ = jax.lax.scan(body, init, (jnp.arange(k), micro))
            loss = loss / k
            aux = jax.tree.map(lambda a: a / k, aux)
            grads = jax.tree.map(lambda g: g / k, grads)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {k_: jnp.asarray(v, jnp.float32) for k_, v in dict(aux).items()}
        if spec is not None:
            m = jnp.asarray(momentum_fn(state.step), jnp.float32)
            ema = jax.tree.map(lambda e, p: (m * e + (1.0 - m) * p.astype(e.dtype)).astype(e.dtype),
                               state.ema, ema_source(params, spec))
            metrics["ema_momentum"] = m
        else:
            ema = state.ema
        metrics.update(loss=jnp.asarray(loss, jnp.float32), grad_norm=grad_norm,
                       lr=jnp.asarray(lr_fn(state.step), jnp.float32),
                       weight_decay=jnp.asarray(wd_fn(state.step), jnp.float32), finite=finite)
        new = TrainState(params=params, ema=ema, opt_state=opt_state, step=state.step + 1, rng=state.rng)
        return new, metrics

    return step_fn


def jit_step(step_fn: Callable, state_shardings: Any, batch_shardings: Any, metrics_sharding: Any) -> Callable:
    """jit with explicit in/out shardings and the state donated."""
    return jax.jit(step_fn, in_shardings=(state_shardings, batch_shardings),
                   out_shardings=(state_shardings, metrics_sharding), donate_argnums=(0,))
