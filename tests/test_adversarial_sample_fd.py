"""Hostile input to `jepa sample` and `jepa fd` (tests/adversarial.py): one error line, exit 2,
nothing written."""

from __future__ import annotations

import json

import numpy as np
import pytest
from adversarial import expect_refusal
from conftest import assert_user_error

from jepa_cli.data import resources, store


@pytest.mark.slow
def test_sampling_a_run_that_is_not_generative_writes_nothing(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"config": {"objective": "ijepa"}, "lengths": {"steps": 1}}))
    expect_refusal("sample", run, "-o", tmp_path / "s.zarr", "--png", tmp_path / "s.png", guard=[tmp_path],
                   fragments=["is not generative"])


@pytest.mark.slow
def test_fd_of_datasets_of_different_dimensions_writes_nothing(tmp_path):
    for name, dim in (("a.zarr", 3), ("b.zarr", 4)):
        store.write_group(tmp_path / name, store.base_attributes("dataset", modality="latent", layout="ND",
                                                                 class_names=[]))
        store.write_array(tmp_path / name / "inputs", np.ones((5, dim), np.float32))
    expect_refusal("fd", tmp_path / "a.zarr", tmp_path / "b.zarr", guard=[tmp_path],
                   fragments=["3-dimensional", "has 4"])


def _dataset(path, inputs, modality="image", layout="NHWC", **attrs):
    store.write_group(path, store.base_attributes("dataset", modality=modality, layout=layout, class_names=[],
                                                  **attrs))
    store.write_array(path / "inputs", inputs)
    return path


def _fake_run(tmp_path, name, config):
    """A run directory and a `load_run` handing back a freshly initialised objective `name` (no checkpoint)."""
    import jax

    from jepa_cli.objectives import make_objective

    run = tmp_path / name
    run.mkdir()
    objective = make_objective(name, config)
    encoder = objective.init(jax.random.key(0))["encoder"]

    def load_run(run_dir, step, on_fallback=None):
        return {"objective": name, "objective_config": config}, objective, {"ema": encoder, "params": {}}, 0

    return run, load_run


def test_fd_gram_and_covariance_methods_give_the_same_distance():
    from jepa_cli.evaluation.fd import fd_method, frechet_distance, frechet_distance_of_features

    rng = np.random.default_rng(0)
    # more samples than dimensions, then fewer: there the covariance method takes square roots of the
    # D - N eigenvalues that are zero up to round-off, which costs it digits
    for n_a, n_b, dim, rel in ((40, 30, 10, 1e-12), (12, 9, 50, 1e-7)):
        fa, fb = rng.standard_normal((n_a, dim)), 0.5 + 2.0 * rng.standard_normal((n_b, dim))
        expected = frechet_distance(fa.mean(0), np.cov(fa, rowvar=False), fb.mean(0), np.cov(fb, rowvar=False))
        for method in ("covariance", "gram"):
            assert frechet_distance_of_features(fa.copy(), fb.copy(), method) == pytest.approx(expected, rel=rel)
    fa = rng.standard_normal((9, 50))
    # the same cloud moved by 0.5 in every dimension: FD = 50 * 0.5^2, the covariance terms cancel
    assert frechet_distance_of_features(fa.copy(), fa + 0.5, "gram") == pytest.approx(12.5, rel=1e-12)
    assert fd_method(1000, 1000, 64)[0] == "covariance" and fd_method(24, 24, 49152)[0] == "gram"


@pytest.mark.slow
def test_fd_of_images_too_large_for_memory_is_refused_before_reading_with_the_figure(tmp_path, monkeypatch,
                                                                                      run_cli):
    a = _dataset(tmp_path / "a.zarr", np.zeros((2, 128, 128, 3), np.uint8))
    monkeypatch.setattr(resources, "available_memory", lambda: 1 << 20)
    # 2 + 2 samples of 49,152 float64 pixels: 1.5 MiB (the gram method's 2 x 2 matrices add 96 bytes)
    assert_user_error(run_cli("fd", a, a), f"{a} and {a}: fd of 49152-dimensional features (2 + 2 samples",
                      "needs about 1.5 MiB of memory but 1.0 MiB is available",
                      "(--run RUN) or at a smaller image size (jepa ingest --size)")


@pytest.mark.slow
def test_fd_reports_its_work_and_progress_over_both_datasets(tmp_path):
    from jepa_cli.evaluation.fd import fd_datasets

    a = _dataset(tmp_path / "a.zarr", np.arange(5 * 12, dtype=np.float32).reshape(5, 3, 4), "latent", "NTD")
    b = _dataset(tmp_path / "b.zarr", np.ones((7, 4), np.float32), "latent", "ND")
    started, progress = [], []
    result = fd_datasets(a, b, on_start=started.append, on_progress=progress.append)
    assert started == [12] and sum(progress) == 12
    assert (result["n_a"], result["n_b"], result["dim"]) == (5, 7, 4)


@pytest.mark.slow
def test_fd_of_a_latent_set_holding_nan_names_the_set_and_the_sample(tmp_path, run_cli):
    good = _dataset(tmp_path / "good.zarr", np.ones((4, 3), np.float32), "latent", "ND")
    z = np.ones((4, 3), np.float32)
    z[2, 1] = np.nan
    bad = _dataset(tmp_path / "bad.zarr", z, "latent", "ND")
    assert_user_error(run_cli("fd", good, bad), f"{bad}: the features of sample 2 are not finite")


@pytest.mark.slow
def test_fd_of_audio_without_a_run_is_refused(tmp_path, run_cli):
    tones = _dataset(tmp_path / "t.zarr", np.zeros((3, 800), np.int16), "audio", "NL", sample_rate=8000)
    assert_user_error(run_cli("fd", tones, tones), f"{tones}: fd compares audio datasets in an encoder's space")


VJEPA = dict(model="tiny", width=24, depth=1, heads=2, patch_size=4, image_size=8, channels=3, num_frames=4,
             tubelet_size=2, pred_depth=1, pred_width=16, total_updates=100, npred=[1, 1],
             pred_scale=[[0.25, 0.25], [0.5, 0.5]])


@pytest.mark.slow
def test_fd_with_a_vjepa_run_on_an_image_set_is_refused(tmp_path):
    from jepa_cli.errors import InputError
    from jepa_cli.evaluation.fd import fd_datasets

    images = _dataset(tmp_path / "i.zarr", np.zeros((3, 8, 8, 3), np.uint8))
    run, load_run = _fake_run(tmp_path, "vjepa", VJEPA)
    with pytest.raises(InputError, match=f"^{images} holds image samples, but {run} \\(objective 'vjepa'\\) "
                                         "encodes video samples: give video data \\(jepa ingest VIDEO_FOLDER "
                                         "OUT.zarr --frames 4\\), or a run trained on image data"):
        fd_datasets(images, images, run, load_run=load_run)


@pytest.mark.slow
def test_fd_with_a_one_channel_run_on_three_channel_images_is_refused(tmp_path):
    from jepa_cli.errors import InputError
    from jepa_cli.evaluation.fd import fd_datasets

    images = _dataset(tmp_path / "i.zarr", np.zeros((3, 8, 8, 3), np.uint8))
    run, load_run = _fake_run(tmp_path, "ijepa", dict(model="tiny", width=32, depth=1, heads=2, patch_size=4,
                                                      image_size=8, channels=1, pred_depth=1, pred_width=16))
    with pytest.raises(InputError, match=f"^{images}: images have 3 channel\\(s\\), but {run} was trained on 1"):
        fd_datasets(images, images, run, load_run=load_run)


@pytest.mark.slow
def test_fd_with_a_vjepa_run_compares_video_sets_in_its_space(tmp_path):
    from jepa_cli.evaluation.fd import fd_datasets

    rng = np.random.default_rng(0)
    a = _dataset(tmp_path / "a.zarr", rng.integers(0, 256, (3, 4, 8, 8, 3), dtype=np.uint8), "video", "NTHWC")
    b = _dataset(tmp_path / "b.zarr", rng.integers(0, 256, (4, 4, 8, 8, 3), dtype=np.uint8), "video", "NTHWC")
    run, load_run = _fake_run(tmp_path, "vjepa", VJEPA)
    same = fd_datasets(a, a, run, load_run=load_run)
    other = fd_datasets(a, b, run, load_run=load_run)
    assert (same["dim"], same["n_a"], abs(same["fd"]) < 1e-9) == (24, 3, True)
    assert other["fd"] > 0


@pytest.mark.slow
def test_fd_of_features_whose_squares_overflow_float64_is_refused(tmp_path, run_cli):
    huge = _dataset(tmp_path / "huge.zarr", np.array([[1e308, -1e308], [1e308, 1e308], [-1e308, 0.0]]),
                    "latent", "ND")
    r = run_cli("fd", huge, huge)
    assert_user_error(r, f"{huge}: features reach 1e+308 in magnitude; fd's float64 statistics of 3 samples "
                         "overflow beyond 1.37e+153")
    assert r.stdout == ""


def test_precision_recall_density_and_coverage_count_samples_inside_knn_balls():
    from jepa_cli.evaluation.fd import density_coverage, precision_recall

    # k = 1 on a line: real 0, 1, 2, 3 have radius 1; fake 0.5 and 3.9 lie inside, 10 does not (2 of 3).
    # fake radii: 0.5 -> 3.4 (to 3.9), 3.9 -> 3.4, 10 -> 6.1: every real point lies within 3.4 of 0.5 or 3.9.
    # Density: 0.5 is in the balls of 0 and 1, 3.9 in that of 3, 10 in none: 3 / (1 x 3 fakes).
    # Coverage: the balls of 0, 1 and 3 hold a fake, that of 2 none: 3 of 4.
    real = np.array([[0.0], [1.0], [2.0], [3.0]])
    fake = np.array([[0.5], [10.0], [3.9]])
    assert precision_recall(real, fake, k=1) == {"precision": 2 / 3, "recall": 1.0}
    assert density_coverage(real, fake, k=1) == {"density": 1.0, "coverage": 0.75}
    # the roles swap: 0 lies in 1 fake ball, 1, 2 and 3 in 2 each (7 / 4); 10's ball (6.1) holds no real point
    assert precision_recall(fake, real, k=1) == {"precision": 1.0, "recall": 2 / 3}
    assert density_coverage(fake, real, k=1) == {"density": 1.75, "coverage": 2 / 3}


def test_a_sample_exactly_on_a_balls_edge_lies_inside_it():
    from jepa_cli.evaluation.fd import density_coverage, precision_recall

    # k = 1 on a line: real 0, 2 and 5 have squared radii 4, 4 and 9; fake -2 is at squared distance 4
    # from 0 (the edge of its ball), 16 from 2 and 49 from 5: inside one ball, on its edge (all exact in float)
    real, fake = np.array([[0.0], [2.0], [5.0]]), np.array([[-2.0], [-2.0]])
    assert precision_recall(real, fake, k=1)["precision"] == 1.0
    assert density_coverage(real, fake, k=1) == {"density": 1.0, "coverage": 1 / 3}


def test_the_four_figures_match_their_definitions_on_random_sets_each_with_its_own_default_k():
    from jepa_cli.evaluation.fd import density_coverage, precision_recall

    rng = np.random.default_rng(0)
    real, fake = rng.standard_normal((60, 5)), 0.5 * rng.standard_normal((40, 5)) + 0.3

    def holds(manifold, queries, k=3):  # [queries, manifold]: query i inside manifold sample j's ball
        d = ((manifold[:, None] - manifold[None]) ** 2).sum(-1)
        radii = np.sort(d, axis=1)[:, k]  # index 0 is the sample itself
        return ((queries[:, None] - manifold[None]) ** 2).sum(-1) <= radii[None]

    # precision and recall at Kynkaanniemi et al.'s k = 3, density and coverage at Naeem et al.'s k = 5
    assert precision_recall(real, fake) == pytest.approx(
        {"precision": holds(real, fake).any(axis=1).mean(), "recall": holds(fake, real).any(axis=1).mean()}, abs=1e-12)
    assert density_coverage(real, fake) == pytest.approx(
        {"density": holds(real, fake, 5).sum() / (5 * len(fake)), "coverage": holds(real, fake, 5).any(axis=0).mean()},
        abs=1e-12)


def test_precision_and_recall_tell_a_collapsed_set_from_a_noisy_one():
    from jepa_cli.evaluation.fd import precision_recall

    rng = np.random.default_rng(1)
    real = rng.standard_normal((400, 4))
    collapsed = real[:20][rng.integers(0, 20, 400)] + 0.01 * rng.standard_normal((400, 4))  # 20 real modes
    noisy = real + 1.5 * rng.standard_normal((400, 4))
    p_c, r_c = (precision_recall(real, collapsed)[key] for key in ("precision", "recall"))
    p_n, r_n = (precision_recall(real, noisy)[key] for key in ("precision", "recall"))
    assert p_c > 0.9 and r_c < 0.3  # faithful but not diverse
    assert p_n < p_c and r_n > r_c


def test_scattered_samples_reach_a_high_recall_but_a_low_coverage():
    from jepa_cli.evaluation.fd import density_coverage, precision_recall

    rng = np.random.default_rng(2)
    real = rng.standard_normal((400, 4))
    scattered = 4.0 * rng.standard_normal((400, 4))  # wide: each sample's 3rd neighbour is far, so its ball is wide
    # recall: 399 of the 400 real points lie in some wide ball; coverage: 44 real balls hold a sample (k = 3)
    assert precision_recall(real, scattered) == {"precision": 0.0825, "recall": 0.9975}
    assert density_coverage(real, scattered, k=3) == {"density": 0.045, "coverage": 0.11}


@pytest.mark.slow
def test_fd_reports_precision_recall_and_coverage_of_a_set_with_itself_as_one(tmp_path, run_cli):
    rng = np.random.default_rng(0)
    a = _dataset(tmp_path / "a.zarr", rng.standard_normal((40, 4)).astype(np.float32), "latent", "ND")
    r = run_cli("fd", a, a, "--json")
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    figures = (out["precision"], out["recall"], out["coverage"], out["k"], out["standardised"])
    assert figures == (1.0, 1.0, 1.0, 3, False)


@pytest.mark.slow
def test_standardised_fd_is_the_fd_of_features_scaled_by_the_reference_sets_mean_and_std(tmp_path):
    from jepa_cli.evaluation.fd import fd_datasets, frechet_distance_of_features

    rng = np.random.default_rng(0)
    za = rng.standard_normal((50, 3)) * [1.0, 100.0, 0.01] + [0.0, 5.0, -1.0]
    zb = rng.standard_normal((60, 3)) * [2.0, 80.0, 0.02] + [0.0, 5.0, -1.0]
    a = _dataset(tmp_path / "a.zarr", za.astype(np.float32), "latent", "ND")
    b = _dataset(tmp_path / "b.zarr", zb.astype(np.float32), "latent", "ND")
    fa, fb = za.astype(np.float32).astype(np.float64), zb.astype(np.float32).astype(np.float64)
    mean, std = fa.mean(axis=0), fa.std(axis=0)
    expected = frechet_distance_of_features((fa - mean) / std, (fb - mean) / std)
    result = fd_datasets(a, b, standardise_features=True)
    assert result["standardised"] and result["fd"] == pytest.approx(expected, rel=1e-9)
    assert fd_datasets(a, b)["fd"] > 50 * result["fd"]  # unstandardised, the 100-wide feature dominates


@pytest.mark.slow
def test_fd_warns_when_a_set_has_too_few_samples_for_its_dimensions(tmp_path):
    from jepa_cli.evaluation.fd import fd_datasets

    rng = np.random.default_rng(0)
    a = _dataset(tmp_path / "a.zarr", rng.standard_normal((6, 8)).astype(np.float32), "latent", "ND")
    b = _dataset(tmp_path / "b.zarr", rng.standard_normal((12, 8)).astype(np.float32), "latent", "ND")
    c = _dataset(tmp_path / "c.zarr", rng.standard_normal((16, 8)).astype(np.float32), "latent", "ND")
    logs = []
    fd_datasets(a, b, on_log=logs.append)
    assert logs == [f"{a}: 6 samples of 8-dimensional features: the covariance is singular (rank at most 5); FD "
                    "compares only the directions the samples span",
                    f"{b}: 12 samples of 8-dimensional features, fewer than 2 x 8: the covariance estimate is noisy "
                    "and FD biased upwards; compare sets of equal size only"]
    logs.clear()
    fd_datasets(c, c, on_log=logs.append)
    assert logs == []


@pytest.mark.slow
def test_fd_with_k_not_below_a_sets_sample_count_is_refused(tmp_path, run_cli):
    a = _dataset(tmp_path / "a.zarr", np.random.default_rng(0).standard_normal((10, 2)).astype(np.float32),
                 "latent", "ND")
    b = _dataset(tmp_path / "b.zarr", np.random.default_rng(1).standard_normal((3, 2)).astype(np.float32),
                 "latent", "ND")
    assert_user_error(run_cli("fd", a, b, "--k", "3"), "--k 3 needs 1 <= k < the sample count", f"{b} has 3 samples")


@pytest.mark.slow
def test_fd_standardise_with_a_constant_reference_feature_is_refused(tmp_path, run_cli):
    z = np.random.default_rng(0).standard_normal((10, 3)).astype(np.float32)
    z[:, 1] = 0.25
    a = _dataset(tmp_path / "a.zarr", z, "latent", "ND")
    assert_user_error(run_cli("fd", a, a, "--standardise"),
                      f"{a}: --standardise divides by each feature's std in this reference set, but 1 of its 3 "
                      "features are constant (the first: feature 1)")


@pytest.mark.slow
def test_fd_of_sets_too_small_for_the_default_k_reports_no_neighbourhood_figures(tmp_path):
    from jepa_cli.evaluation.fd import fd_datasets

    a = _dataset(tmp_path / "a.zarr", np.arange(6, dtype=np.float32).reshape(3, 2), "latent", "ND")
    logs = []
    result = fd_datasets(a, a, on_log=logs.append)
    assert [result[key] for key in ("precision", "recall", "density", "coverage")] == [None] * 4
    assert abs(result["fd"]) < 1e-9
    assert f"{a}: 3 samples; precision and recall need more than k = 3 in each set (reported as null)" in logs
    assert f"{a}: 3 samples; density and coverage need more than dc-k = 5 in each set (reported as null)" in logs


@pytest.mark.slow
def test_a_set_of_five_samples_gets_precision_and_recall_but_not_the_figures_of_five_neighbours(tmp_path):
    from jepa_cli.evaluation.fd import fd_datasets

    a = _dataset(tmp_path / "a.zarr", np.arange(10, dtype=np.float32).reshape(5, 2), "latent", "ND")
    result = fd_datasets(a, a, on_log=lambda message: None)
    assert [result[key] for key in ("precision", "recall", "density", "coverage", "k", "dc_k")] == \
        [1.0, 1.0, None, None, 3, 5]


@pytest.mark.slow
def test_density_and_coverage_take_their_own_k(tmp_path, run_cli):
    # A: 0..5 and 2.5 on a line; B: the same shifted by 10. The real point 5 has its neighbours at distances
    # 1, 2, 2.5, 3, 4, 5: at k = 5 its ball (radius 4) holds no point of B, at k = 6 (radius 5) it holds 10,
    # on its edge; every other ball of A ends below 10, and at --k 1 no ball of A reaches B
    real = np.array([[0.0], [1.0], [2.0], [3.0], [4.0], [5.0], [2.5]], np.float32)
    a = _dataset(tmp_path / "a.zarr", real, "latent", "ND")
    b = _dataset(tmp_path / "b.zarr", real + 10, "latent", "ND")
    figures = ("k", "dc_k", "precision", "density", "coverage")
    out = json.loads(run_cli("fd", a, b, "--k", "1", "--json").stdout)
    assert [out[key] for key in figures] == [1, 5, 0.0, 0.0, 0.0]
    out = json.loads(run_cli("fd", a, b, "--k", "1", "--dc-k", "6", "--json").stdout)
    assert [out[key] for key in figures] == [1, 6, 0.0, pytest.approx(1 / (6 * 7)), pytest.approx(1 / 7)]
    assert_user_error(run_cli("fd", a, b, "--dc-k", "7"), "--dc-k 7 needs 1 <= k < the sample count",
                      f"{a} has 7 samples")
