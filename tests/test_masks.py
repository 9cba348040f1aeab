"""Mask samplers: properties, coverage without raster bias, the official quirks, parity with the official
algorithms (a NumPy restatement in tests/official_masks.py, compared with two-sample KS tests)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from jepa_cli import masks as M
from jepa_cli.errors import InputError
from jepa_cli.masks.sizes import multiblock_context_sizes, multiblock_target_sizes

from official_masks import ijepa_collate, ks_critical, ks_statistic, vjepa_generator

SETTINGS = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def dense(index, valid, n):
    """Index form -> dense bool, in NumPy (no compilation)."""
    index, valid = np.asarray(index), np.asarray(valid)
    out = np.zeros(index.shape[:-1] + (n,), bool)
    lead = np.indices(index.shape[:-1])
    sel = tuple(np.broadcast_to(a[..., None], index.shape)[valid] for a in lead)
    out[sel + (index[valid],)] = True
    return out


def draw(config, batches: int, batch_size: int, seed: int = 0):
    """`batches` independent batches: context [G, B, C, N], targets [G, B, M, N] (NumPy) and the MaskSet."""
    ms = M.sample_many(jax.random.PRNGKey(seed), config, batch_size, batches)
    n = config.num_patches
    return dense(ms.context_index, ms.context_valid, n), dense(ms.target_index, ms.target_valid, n), ms


def _bbox(flat: np.ndarray, grid):
    H, W = grid
    rows, cols = np.nonzero(flat.reshape(H, W))
    return rows.min(), rows.max() + 1, cols.min(), cols.max() + 1


# Property tests: a few static configs (one compilation each) x many keys.
MULTIBLOCK = [
    M.MultiBlockConfig(grid=(4, 4), npred=1, pred_scale=(0.3, 0.5), min_keep=1, allow_overlap=True, context_size=16),
    M.MultiBlockConfig(grid=(7, 11), npred=3, pred_scale=(0.1, 0.25), aspect=(0.5, 2.0), min_keep=3,
                       context_size=77),
    M.MultiBlockConfig(grid=(32, 32), context_size=1024),
]


@SETTINGS
@given(index=st.integers(0, len(MULTIBLOCK) - 1), seed=st.integers(0, 2**31 - 1))
def test_multiblock_properties(index, seed):
    config = MULTIBLOCK[index]
    context, targets, ms = draw(config, 1, 8, seed)
    context, targets = context[0, :, 0], targets[0]
    sizes = set()
    for b in range(context.shape[0]):
        for m in range(config.npred):
            r0, r1, c0, c1 = _bbox(targets[b, m], config.grid)
            assert (r1 - r0) * (c1 - c0) == targets[b, m].sum()  # an axis-aligned rectangle inside the grid
            sizes.add((r1 - r0, c1 - c0))
        if not config.allow_overlap:
            assert not (context[b] & targets[b].any(0)).any()
        assert context[b].sum() > config.min_keep
    assert len(sizes) == 1 and sizes <= multiblock_target_sizes(config)  # one size per batch
    # every context lies inside one context block of the batch's shared size
    spans = {(r1 - r0, c1 - c0) for r0, r1, c0, c1 in (_bbox(c, config.grid) for c in context)}
    assert any(all(h <= eh and w <= ew for h, w in spans) for eh, ew in multiblock_context_sizes(config))
    # same key, same masks
    again = M.sample_many(jax.random.PRNGKey(seed), config, 8, 1)
    for x, y in zip(jax.tree.leaves(ms), jax.tree.leaves(again)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# Two pairs on a 4x10x10 grid: short blocks with a temporal range, and long tubes.
VIDEO = M.MultiBlock3DConfig(grid=(10, 10), frames=4, npred=(4, 2), pred_scale=((0.15, 0.3), (0.5, 0.6)),
                             temporal_scale=((0.5, 1.0), (1.0, 1.0)), context_size=400)
VIDEO_BATCHES = 600


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_multiblock3d_properties(seed):
    context, targets, _ = draw(VIDEO, VIDEO_BATCHES, 1, seed)
    context, targets = context[:, 0], targets[:, 0]  # [G, P, N]
    D, (H, W) = VIDEO.frames, VIDEO.grid
    assert context.shape == targets.shape == (VIDEO_BATCHES, 2, D * H * W)
    assert not (context & targets).any() and (context | targets).all()  # context = complement of target
    assert context.sum(-1).min() >= 1  # an empty context is resampled
    tubes = targets[:, 1].reshape(-1, D, H * W)
    assert (tubes == tubes[:, :1]).all()  # temporal scale 1: every frame has the same target
    frames_hit = targets[:, 0].reshape(-1, D, H * W).any(-1).sum(-1)
    assert frames_hit.min() >= 2  # temporal extent at least int(4 * 0.5)


RANDOM = [M.RandomConfig(grid=(4, 4), ratio=(0.1, 0.9)), M.RandomConfig()]
RANDOM_BATCHES = 1000


@SETTINGS
@given(index=st.integers(0, len(RANDOM) - 1), seed=st.integers(0, 2**31 - 1))
def test_random_properties(index, seed):
    config = RANDOM[index]
    n = config.num_patches
    context, targets, _ = draw(config, RANDOM_BATCHES, 8, seed)
    context, targets = context[:, :, 0], targets[:, :, 0]
    counts = context.sum(-1)
    assert (counts == counts[:, :1]).all()  # one ratio per batch
    assert int(n * (1 - config.ratio[1])) <= counts.min() and counts.max() <= int(n * (1 - config.ratio[0]))
    assert not (context & targets).any() and (context | targets).all()


# The 14x14 grid of the issue: ours (derived K = 64), all tokens kept, the official quirks.
G, B = 32, 128
OURS = M.MultiBlockConfig(grid=(14, 14), context_size=64)
WHOLE = dataclasses.replace(OURS, context_size=196)
CUT = dataclasses.replace(OURS, context_size=169, official_truncation=True)  # == the derivation probe
POSITIONS = dataclasses.replace(WHOLE, official_positions=True)


def test_index_form_contract():
    _, _, ms = draw(OURS, G, B, seed=3)
    assert ms.context_index.dtype == np.int32 and ms.context_valid.dtype == bool
    assert ms.context_index.shape == (G, B, 1, 64) and ms.target_index.shape[:3] == (G, B, 4)
    for index, valid in ((ms.context_index, ms.context_valid), (ms.target_index, ms.target_valid)):
        index, valid = np.asarray(index)[:2], np.asarray(valid)[:2]
        assert (index[~valid] == 0).all()  # padding holds index 0
        assert (np.diff(valid.astype(int), axis=-1) <= 0).all()  # valid slots first
        for row, ok in zip(index.reshape(-1, index.shape[-1]), valid.reshape(-1, valid.shape[-1])):
            assert (np.diff(row[ok]) > 0).all()  # ascending, no duplicates
    context, targets = M.to_dense(jax.tree.map(lambda x: x[0], ms), 196)
    np.testing.assert_array_equal(np.asarray(context), dense(ms.context_index[0], ms.context_valid[0], 196))


def test_coverage_without_raster_bias():
    context, targets, _ = draw(OURS, G, B, seed=1)
    H, W = OURS.grid
    ctx = context[..., 0, :].reshape(-1, H, W).mean(0)
    tgt = targets.any(-2).reshape(-1, H, W).mean(0)
    assert (ctx > 0).all() and (tgt > 0).all()  # every position, the last row and column included
    for cov in (ctx, tgt):  # uniform positions: the map is symmetric under a half turn
        assert np.abs(cov - cov[::-1, ::-1]).max() < 0.06
        assert abs(np.corrcoef(cov.ravel(), np.arange(H * W))[0, 1]) < 0.1


def test_ours_keeps_a_random_subset_not_the_lowest_indices():
    sub, _, _ = draw(OURS, G, B, seed=2)
    whole, _, _ = draw(WHOLE, G, B, seed=2)
    sub, whole = sub[..., 0, :].reshape(-1, 196), whole[..., 0, :].reshape(-1, 196)
    # the subset lies inside the full context (same key, same blocks) and has min(count, K) members
    assert not (sub & ~whole).any()
    np.testing.assert_array_equal(sub.sum(-1), np.minimum(whole.sum(-1), 64))
    # a member is kept with the same probability in the first and the second half of the raster order
    rank = np.cumsum(whole, axis=-1) - 1
    half = whole.sum(-1, keepdims=True) / 2
    first, second = (sub & (rank < half)).sum(), (sub & (rank >= half)).sum()
    assert abs(first - second) / (first + second) < 0.05


def test_official_position_quirk():
    _, targets, _ = draw(POSITIONS, 1500, 4, seed=4)
    tgt = targets.any(-2).reshape(-1, 14, 14).mean(0)
    assert tgt[-1].max() == 0 and tgt[:, -1].max() == 0 and tgt[:-1, :-1].min() > 0  # never the last row/column


def test_official_truncation_quirk():
    context, _, ms = draw(CUT, G, B, seed=1)
    ctx = context[..., 0, :].reshape(-1, 14, 14).mean(0)
    counts = np.asarray(ms.context_valid).sum(-1)
    assert (counts == counts[:, :1]).all()  # every context of a batch has the batch-minimum length
    # the lowest indices survive, so the context coverage falls along the raster order
    assert np.corrcoef(ctx.ravel(), np.arange(196))[0, 1] < -0.3
    assert ctx[:7].mean() > 1.5 * ctx[7:].mean()
    whole, _, _ = draw(WHOLE, G, B, seed=1)  # same key, same blocks, every token kept
    for g, b in ((0, 0), (1, 5), (7, 100)):
        members = np.flatnonzero(whole[g, b, 0])
        kept = np.asarray(ms.context_index[g, b, 0])[np.asarray(ms.context_valid[g, b, 0])]
        np.testing.assert_array_equal(kept, members[: counts[g, b, 0]])


def test_derived_context_size_covers_the_official_cut():
    k = M.context_slots(M.MultiBlockConfig(grid=(14, 14)))
    assert k == 59  # the derivation is fixed by its key: a change of the probe's draw moves it
    _, _, ms = draw(CUT, G, B, seed=9)  # the official cut of 32 other batches
    cuts = np.asarray(ms.context_valid).sum(-1).min(1)[:, 0]
    assert (cuts <= k).mean() >= 0.75  # about 9 batches in 10 keep at least the official cut
    assert k < np.asarray(ms.context_valid).sum(-1).max()  # and it is not the no-drop maximum


def test_derived_context_size_is_one_compiled_program_and_the_same_inside_a_trace(caplog):
    config = M.MultiBlockConfig(grid=(10, 10))  # a grid no other test derives K for
    derive = M.context_slots.__wrapped__  # around the lru_cache
    with jax.log_compiles(True), caplog.at_level("WARNING"):
        outside = derive(config)
    compiles = [r for r in caplog.records if "Finished XLA compilation" in r.getMessage()]
    assert len(compiles) == 1, [r.getMessage() for r in compiles]  # op by op it was about 70
    inside = []
    jax.jit(lambda x: inside.append(derive(config)) or x)(0)  # K asked while a step is traced
    assert inside == [outside] == [27]
    assert M.context_slots(M.MultiBlockConfig(grid=(14, 14))) == 59  # in1k_vith14's grid


def test_official_truncation_slots_fit_the_batch_minimum_at_that_batch_size():
    config = M.MultiBlockConfig(grid=(8, 8), official_truncation=True)
    k32, k128 = M.context_slots(config, 32), M.context_slots(config, 128)
    assert k128 <= k32 < 49  # smaller batches have larger minima; far below the largest context
    whole = dataclasses.replace(config, context_size=49)  # same key, same blocks, no slot limit
    _, _, ms = draw(whole, G, 32, seed=11)
    cuts = np.asarray(ms.context_valid).sum(-1)[:, 0, 0]
    assert (cuts <= k32).mean() >= 0.95  # the official cut fits K in (nearly) every batch


# Distribution parity with the official algorithms (two-sample KS at level 0.001).
def _ks_same(a, b):
    assert ks_statistic(a, b) < ks_critical(len(a), len(b)), (np.mean(a), np.mean(b))


def test_multiblock_parity_with_official():
    n = 1500
    context, targets, _ = draw(POSITIONS, n, 4, seed=5)
    ours_h, ours_w = [], []
    for g in range(n):
        r0, r1, c0, c1 = _bbox(targets[g, 0, 0], (14, 14))
        ours_h.append(r1 - r0)
        ours_w.append(c1 - c0)
    ours_ctx = context[:, 0, 0].sum(-1)  # one sample per batch: independent draws
    rng = np.random.default_rng(0)
    ref_h, ref_w, ref_ctx = [], [], []
    for _ in range(n):
        enc, _, (h, w), _ = ijepa_collate(rng, 1, grid=(14, 14), truncate=False)
        ref_h.append(h)
        ref_w.append(w)
        ref_ctx.append(len(enc[0]))
    _ks_same(ours_h, ref_h)
    _ks_same(ours_w, ref_w)
    _ks_same(np.multiply(ours_h, ours_w), np.multiply(ref_h, ref_w))
    _ks_same(ours_ctx, ref_ctx)
    # our full-grid positions keep the block sizes and move the context size only a little
    fixed, _, _ = draw(WHOLE, G, B, seed=6)
    assert abs(fixed[:, :, 0].sum(-1).mean() - np.mean(ref_ctx)) < 0.1 * np.mean(ref_ctx)


def test_multiblock3d_parity_with_official():
    context, _, _ = draw(VIDEO, VIDEO_BATCHES, 1, seed=7)
    rng = np.random.default_rng(1)
    for p, (npred, scale, tscale) in enumerate(zip(VIDEO.npred, VIDEO.pred_scale, VIDEO.temporal_scale)):
        ref = [len(vjepa_generator(rng, 1, frames=4, grid=(10, 10), npred=npred, spatial_scale=scale,
                                   temporal_scale=tscale, truncate=False)[0][0]) for _ in range(VIDEO_BATCHES)]
        _ks_same(context[:, 0, p].sum(-1), ref)


def test_random_parity_with_official():
    config = RANDOM[1]
    context, _, _ = draw(config, RANDOM_BATCHES, 8, seed=8)
    ours = context[:, 0, 0].sum(-1)
    rng = np.random.default_rng(2)
    n = config.num_patches
    _ks_same(ours, [int(n * (1 - rng.uniform(0.4, 0.6))) for _ in range(RANDOM_BATCHES)])


@pytest.mark.parametrize("strategy, options, fragment", [
    ("multiblock", {"grid": (2, 2), "npred": 4, "min_keep": 10}, "cannot hold"),
    ("multiblock", {"pred_scale": "0,0.2"}, "(0, 1]"),
    ("multiblock", {"enc_scale": "0.85,1.2"}, "(0, 1]"),
    ("multiblock", {"aspect": "1.5,0.75"}, "inverted"),
    ("random", {"ratio": "0.6,0.4"}, "inverted"),
    ("multiblock", {"frames": 8}, "--frames"),
    ("random", {"frames": 8}, "--frames"),
    ("multiblock3d", {"npred": "8,2", "pred_scale": "0.15,0.7,0.2"}, "one per mask pair"),
    ("random", {"npred": 3}, "--npred"),
])
def test_config_from_options_rejects_bad_input(strategy, options, fragment):
    with pytest.raises(InputError) as err:
        M.config_from_options(strategy, **options)
    message = str(err.value)
    assert "\n" not in message and fragment in message


def test_config_from_options_defaults_are_official():
    assert M.config_from_options("multiblock") == M.MultiBlockConfig()
    c = M.config_from_options("multiblock3d", grid=(14, 14), frames=8, npred="8,2", pred_scale="0.15,0.7")
    assert c == M.MultiBlock3DConfig()
    assert M.config_from_options("random", ratio="0.4,0.6") == M.RandomConfig()
    assert hash(M.MultiBlockConfig()) == hash(M.MultiBlockConfig())


@settings(max_examples=30, deadline=None)
@given(H=st.integers(4, 32), W=st.integers(4, 32), lo=st.floats(0.05, 1.0), span=st.floats(0.0, 0.5),
       a_lo=st.floats(0.3, 2.0), a_span=st.floats(0.0, 2.0), seed=st.integers(0, 2**32 - 1))
# widths past the height's breakpoints (an enumeration stopping at sqrt(k * ar_hi) misses them)
@example(H=22, W=24, lo=0.25, span=0.0, a_lo=0.375, a_span=1.0, seed=0)
def test_static_block_sizes_cover_every_draw(H, W, lo, span, a_lo, a_span, seed):
    """The static T (and the min_keep check) come from an exact enumeration of the reachable sizes."""
    from official_masks import ijepa_block_size, vjepa_block_size

    from jepa_cli.masks.sizes import block_sizes

    scale, aspect = (lo, min(1.0, lo + span)), (a_lo, a_lo + a_span)
    correlated = block_sizes((H, W), scale, aspect, True, True)
    independent = block_sizes((H, W), scale, aspect, False, False)
    rng = np.random.default_rng(seed)
    for _ in range(200):
        assert ijepa_block_size(rng, (H, W), scale, aspect) in correlated
        assert vjepa_block_size(rng, 4, (H, W), (1.0, 1.0), scale, aspect)[1:] in independent


@settings(max_examples=40, deadline=None)
@given(H=st.integers(2, 32), W=st.integers(2, 32), npred=st.integers(1, 6), min_keep=st.integers(0, 20))
@example(H=14, W=14, npred=4, min_keep=10).via("accepted: targets of 30+ tokens, contexts of 169+")
@example(H=2, W=2, npred=1, min_keep=0).via("refused: a target block can be empty")
@example(H=4, W=4, npred=4, min_keep=9).via("refused: a context block can hold just 9 tokens")
def test_validation_over_grids(H, W, npred, min_keep):
    """A configuration is refused exactly when some reachable target block is empty or some reachable
    context block holds no more than min_keep tokens (sizes enumerated from the unvalidated config)."""
    unchecked = M.MultiBlockConfig(grid=(H, W), npred=npred, min_keep=min_keep)
    holds = min(h * w for h, w in multiblock_target_sizes(unchecked)) >= 1 and \
        min(h * w for h, w in multiblock_context_sizes(unchecked)) > min_keep
    try:
        config = M.config_from_options("multiblock", grid=(H, W), npred=npred, min_keep=min_keep)
    except InputError as err:
        assert not holds, f"refused a configuration that holds its masks: {err}"
        assert "\n" not in str(err) and "cannot hold" in str(err)
        return
    assert holds
    assert M.target_slots(config) >= max(h * w for h, w in multiblock_target_sizes(config))
