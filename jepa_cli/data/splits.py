"""The train/test split of `jepa ingest --split`: stratified by label, or by group so that every group
(a speaker, a source video, a photo session) lies on one side (docs/formats.md, "Splits")."""

from __future__ import annotations

from typing import Any

import numpy as np

from jepa_cli.errors import InputError


def split_indices(labels: np.ndarray | None, count: int, split: str | None, test_fraction: float,
                  seed: int, groups: np.ndarray | None = None) -> np.ndarray:
    """Sorted sample indices of a deterministic split (all indices when `split` is None).

    Without `groups`: within each class a permutation from `default_rng(seed)` sends the first
    round(n_c * F) samples to `test`. With `groups` (int [count], one id per sample): whole groups go
    to `test` (`pick_test_groups`). `train` gets the rest, so the two splits are disjoint and cover the source.
    """
    if split is None:
        if groups is not None:
            raise InputError("--group-regex and --group-column keep each group on one side of a split; give "
                             "--split train or --split test")
        return np.arange(count)
    if split not in ("train", "test"):
        raise InputError(f"--split must be train or test, got {split!r}")
    if not 0.0 < test_fraction < 1.0:
        raise InputError(f"--test-fraction must lie in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    if groups is not None:
        test = np.isin(groups, pick_test_groups(groups, test_fraction, rng))
        return np.flatnonzero(test if split == "test" else ~test)
    strata = labels if labels is not None else np.zeros(count, np.int32)
    test = np.zeros(count, bool)
    for value in np.unique(strata):
        members = np.flatnonzero(strata == value)
        chosen = rng.permutation(members)[: int(round(len(members) * test_fraction))]
        test[chosen] = True
    return np.flatnonzero(test if split == "test" else ~test)


def pick_test_groups(groups: np.ndarray, test_fraction: float, rng: np.random.Generator) -> np.ndarray:
    """The group ids sent to `test`: groups in an order drawn from `rng`, each taken when it brings the
    test side's sample count closer to round(N * F); the first is always taken and one group always
    stays for `train`. InputError when there are fewer than two groups."""
    ids, sizes = np.unique(groups, return_counts=True)
    if len(ids) < 2:
        raise InputError(f"the group option gives one group for all {len(groups)} samples; a split needs two or "
                         "more (check --group-regex or the group column)")
    target = round(len(groups) * test_fraction)
    chosen: list[int] = []
    taken = 0
    for position in rng.permutation(len(ids)):
        size = int(sizes[position])
        if not chosen or abs(taken + size - target) < abs(taken - target):
            chosen.append(position)
            taken += size
    if len(chosen) == len(ids):  # every group reached test: the last one taken goes back to train
        chosen.pop()
    return ids[np.asarray(chosen, int)]


def group_names_of(groups: np.ndarray | None, names: list[str], indices: np.ndarray) -> list[str] | None:
    """The names of the groups of the samples at `indices`, sorted; None without groups."""
    if groups is None:
        return None
    return sorted({names[g] for g in np.unique(groups[indices])})


def split_attribute(split: str | None, test_fraction: float, seed: int, grouping: dict[str, Any] | None = None,
                    group_names: list[str] | None = None) -> dict[str, Any] | None:
    """The dataset's `split` attribute: None without a split; with groups, how they were found
    (`group_regex` or `group_column`) and the names of the groups on this side, sorted."""
    if split is None:
        return None
    out: dict[str, Any] = {"name": split, "test_fraction": test_fraction, "seed": seed}
    if grouping is not None:
        out.update(grouping)
        out["groups"] = sorted(group_names or [])
    return out
