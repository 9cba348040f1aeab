"""Modules across the Objective seam: ``to_pure`` turns a module into a nested dict of arrays
(string keys only, so that checkpoints and path-based sharding see plain names) and a
``ModuleTemplate`` rebuilds a module from such a dict (inside jit too); ``param_count`` and
``first_non_finite`` read such a dict."""

from __future__ import annotations

import collections
import inspect
import math
from typing import Any, Callable, Hashable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jepa_cli.models.layers import trunc_normal


def _str_keys(tree):
    if isinstance(tree, dict):
        return {str(k): _str_keys(v) for k, v in tree.items()}
    return tree


def to_pure(module: nnx.Module) -> dict:
    """The module's parameters as a nested dict of arrays with string keys."""
    return _str_keys(nnx.to_pure_dict(nnx.split(module)[1]))


# How ModuleTemplate.init fills a leaf, by its name: the official I-JEPA initialisation
# (trunc-normal(0.02) weights and mask token, zero biases, LayerNorm scale 1).
INIT_RULES: dict[str, str] = {"kernel": "normal", "mask_token": "normal", "bias": "zeros", "scale": "ones",
                              "mask_tokens": "zeros",  # V-JEPA: zero-initialised mask tokens (vitl16.yaml)
                              # DiT: label table trunc-normal(0.02), adaLN-Zero / final layer zeros
                              "embedding": "normal", "zero_kernel": "zeros", "zero_bias": "zeros"}


FLAT_INIT_LIMIT = 1 << 24  # parameters drawn in one flat vector below this size


def _grouped_init(key, shapes: dict, std: float = 0.02) -> dict:
    """Parameters for ``shapes`` following INIT_RULES, with one random draw per distinct shape
    (stacked over the leaves of that shape) instead of one per leaf: the same distribution as the
    modules' own initialisers, but a graph XLA compiles in a fraction of the time."""
    flat = jax.tree_util.tree_flatten_with_path(shapes)[0]
    treedef = jax.tree_util.tree_structure(shapes)
    out: list = [None] * len(flat)
    groups: dict[tuple, list[int]] = {}
    for i, (path, leaf) in enumerate(flat):
        rule = INIT_RULES[path[-1].key]
        if rule == "normal":
            groups.setdefault(tuple(leaf.shape), []).append(i)
        else:
            fill = jnp.zeros if rule == "zeros" else jnp.ones
            out[i] = fill(leaf.shape, leaf.dtype)
    total = sum(len(v) * math.prod(k) for k, v in groups.items())
    if total <= FLAT_INIT_LIMIT:  # small models: one draw for everything (one RNG graph to compile)
        draw = trunc_normal(std)(key, (total,))
        offset = 0
        for shape in sorted(groups):
            for i in groups[shape]:
                n = math.prod(shape)
                out[i] = draw[offset:offset + n].reshape(shape).astype(flat[i][1].dtype)
                offset += n
        return jax.tree_util.tree_unflatten(treedef, out)
    for g, shape in enumerate(sorted(groups)):
        idx = groups[shape]
        draw = trunc_normal(std)(jax.random.fold_in(key, g), (len(idx), *shape))
        for j, i in enumerate(idx):
            out[i] = draw[j].astype(flat[i][1].dtype)
    return jax.tree_util.tree_unflatten(treedef, out)


# structures already built, by build key: tracing a large model's construction under eval_shape
# costs seconds (ViT-B: about 2 s each), and the trainer asks for the same model several times
_STRUCTURES: "collections.OrderedDict[Hashable, tuple]" = collections.OrderedDict()
_STRUCTURES_KEPT = 16


class _KeyStream:
    """Stands in for ``nnx.Rngs(params=key)`` when a module is built inside a trace: the same keys
    (``fold_in(key, n)`` for the n-th draw), counted in Python. nnx.Rngs counts its draws with traced
    arithmetic, and each draw then makes JAX search the whole trace so far for an error message it
    never shows (a tracer asked for its sharding): quadratic in the parameter count, 5.8 s for a
    ViT-H encoder's structure."""

    def __init__(self, key: jax.Array):
        if key.dtype == jnp.uint32:  # a raw PRNGKey, as nnx.Rngs takes it
            key = jax.random.wrap_key_data(key)
        self._key, self._draws = key, 0

    def params(self) -> jax.Array:
        key = jax.random.fold_in(self._key, self._draws)
        self._draws += 1
        return key


class ModuleTemplate:
    """Builds a module's structure once (abstractly, no allocation) and merges pure dicts into it.

    ``key`` names the structure for reuse across templates (a bound method of a frozen config,
    such as ``ModelConfig.encoder``, is its own key); templates with equal keys share one build."""

    def __init__(self, build: Callable[[nnx.Rngs], nnx.Module], key: Hashable | None = None):
        if key is None and inspect.ismethod(build):  # bound methods compare their objects by identity
            key = (build.__func__, build.__self__)
        try:
            hash(key)
        except TypeError:  # an unhashable config: no reuse
            key = None
        cached = _STRUCTURES.get(key) if key is not None else None
        if cached is None:
            cached = self._structure(build)
            if key is not None:
                _STRUCTURES[key] = cached
                while len(_STRUCTURES) > _STRUCTURES_KEPT:
                    _STRUCTURES.popitem(last=False)
        self.graphdef, self.abstract_state, self._init = cached

    def _structure(self, build: Callable[[nnx.Rngs], nnx.Module]) -> tuple:
        graphdef, abstract_state = nnx.split(nnx.eval_shape(lambda: build(_KeyStream(jax.random.key(0)))))
        shapes = _str_keys(nnx.to_pure_dict(abstract_state))
        names = {p[-1].key for p, _ in jax.tree_util.tree_flatten_with_path(shapes)[0]}
        if names <= set(INIT_RULES):
            init = jax.jit(lambda key: _grouped_init(key, shapes))
        else:  # a leaf without a rule: the modules' own initialisers
            init = jax.jit(lambda key: to_pure(build(_KeyStream(key))))
        return graphdef, abstract_state, init

    def init(self, key) -> dict:
        """Fresh float32 parameters (jitted; works under eval_shape and with out_shardings)."""
        return self._init(key)

    def shapes(self) -> dict:
        """Parameter shapes/dtypes (jax.ShapeDtypeStruct) as a nested dict, no allocation."""
        return _str_keys(nnx.to_pure_dict(self.abstract_state))

    def merge(self, params: dict) -> Any:
        state = jax.tree.map(lambda v: v, self.abstract_state)
        nnx.replace_by_pure_dict(state, params)
        return nnx.merge(self.graphdef, state)


def param_count(tree) -> int:
    return int(sum(np.prod(np.shape(x)) for x in jax.tree.leaves(tree)))


def first_non_finite(tree) -> tuple[tuple, int, int] | None:
    """The first float leaf of a parameter tree that holds NaN or inf, as (its key path, how many such
    values, its size); None when every value is finite (a diverged run's weights are not)."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        value = np.asarray(leaf)
        if value.dtype.kind in "fc" and not np.isfinite(value).all():
            return path, int(value.size - np.count_nonzero(np.isfinite(value))), int(value.size)
    return None
