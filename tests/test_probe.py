"""`jepa probe`: linear, k-NN and attentive probes on synthetic features; bad input exits 2."""

import json

import numpy as np
import pytest

from conftest import assert_user_error
from jepa_cli.data import store


def write_dataset(path, inputs, labels=None, modality="latent", class_names=None, provenance=None):
    inputs = np.asarray(inputs)
    extra = {"provenance": provenance} if provenance is not None else {}
    store.write_group(path, store.base_attributes("dataset", modality=modality, layout="ND",
                                                  class_names=class_names or [], source="test",
                                                  num_samples=len(inputs), **extra))
    store.write_array(path / "inputs", inputs)
    if labels is not None:
        store.write_array(path / "labels", np.asarray(labels, np.int32))
    return path


def separable(rng, n, num_classes=5, dim=24):
    centers = np.eye(num_classes, dim) * 6.0
    y = rng.integers(0, num_classes, n)
    return (centers[y] + rng.normal(size=(n, dim))).astype(np.float32), y.astype(np.int32)


@pytest.mark.slow
def test_linear_probe_separable_is_perfect_and_shuffled_is_chance(tmp_path, run_cli):
    rng = np.random.default_rng(0)
    x, y = separable(rng, 800)
    xt, yt = separable(rng, 400)
    tr = write_dataset(tmp_path / "tr.zarr", x, y)
    te = write_dataset(tmp_path / "te.zarr", xt, yt)
    result = run_cli("probe", "linear", tr, te, "--json")
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["probe"] == "linear" and out["n_train"] == 800 and out["n_test"] == 400
    assert out["top1"] >= 0.99 and out["top5"] is None  # 5 classes: no top-5
    assert set(out) >= {"probe", "top1", "top5", "n_train", "n_test", "weight_decay"}

    # shuffled labels, unrelated to the features: test accuracy at chance (1/5)
    from jepa_cli.evaluation.linear import linear_probe

    r = linear_probe(x, rng.permutation(y), xt, rng.integers(0, 5, 400), 5)
    assert abs(r["top1"] - 0.2) < 0.06


def knn_reference(x_train, y_train, x_test, num_classes, k, temperature, majority):
    a = x_train / np.linalg.norm(x_train, axis=1, keepdims=True)
    b = x_test / np.linalg.norm(x_test, axis=1, keepdims=True)
    sims = b.astype(np.float64) @ a.T.astype(np.float64)
    idx = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    top = np.take_along_axis(sims, idx, axis=1)
    w = np.ones_like(top) if majority else np.exp(top / temperature)
    votes = np.zeros((len(b), num_classes))
    for j in range(k):
        np.add.at(votes, (np.arange(len(b)), y_train[idx[:, j]]), w[:, j])
    return np.argsort(-votes, axis=1, kind="stable")[:, :min(5, k, num_classes)]


@pytest.mark.parametrize("vote", ["weighted", "majority"])
def test_knn_equals_numpy_reference(vote):
    from jepa_cli.evaluation.knn import knn_probe, knn_rank

    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(300, 16)).astype(np.float32), rng.integers(0, 7, 300)
    x[:, 0] += y  # some structure, so accuracies are not trivial
    xt, yt = rng.normal(size=(130, 16)).astype(np.float32), rng.integers(0, 7, 130)
    xt[:, 0] += yt
    # a batch size that does not divide N_test exercises the padded last batch
    ranked = knn_rank(x, y, xt, 7, k=20, temperature=0.07, vote=vote, batch_size=32)
    ref = knn_reference(x, y, xt, 7, 20, 0.07, vote == "majority")
    # tied votes (frequent with integer majority counts) go to the lower class index in both
    np.testing.assert_array_equal(ranked, ref)
    out = knn_probe(x, y, xt, yt, 7, k=20, vote=vote)
    assert out["top1"] == float((ref[:, 0] == yt).mean())  # 0.308 weighted, 0.285 majority: one test row is 0.0077
    assert out["top5"] == float((ref == yt[:, None]).any(axis=1).mean())


@pytest.mark.parametrize("probe", ["linear", "knn", "attentive"])
@pytest.mark.parametrize("num_classes, has_top5", [(5, False), (6, True)])
def test_top5_is_reported_only_with_more_than_5_classes(probe, num_classes, has_top5):
    from jepa_cli.evaluation.attentive import attentive_probe
    from jepa_cli.evaluation.knn import knn_probe
    from jepa_cli.evaluation.linear import linear_probe

    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(48, 2, 8)).astype(np.float32), np.arange(48) % num_classes
    xt, yt = rng.normal(size=(24, 2, 8)).astype(np.float32), np.arange(24) % num_classes
    run = {"linear": lambda: linear_probe(x.mean(1), y, xt.mean(1), yt, num_classes, max_iter=20),
           "knn": lambda: knn_probe(x.mean(1), y, xt.mean(1), yt, num_classes, k=10),
           "attentive": lambda: attentive_probe(x, y, xt, yt, num_classes, epochs=1, batch_size=16)}[probe]
    assert isinstance(run()["top5"], float) == has_top5


@pytest.mark.slow
def test_probe_output_omits_the_top5_of_4_classes_and_json_gives_null(tmp_path, run_cli):
    rng = np.random.default_rng(5)
    x, y = separable(rng, 80, num_classes=4)
    tr = write_dataset(tmp_path / "tr.zarr", x, y)
    result = run_cli("probe", "knn", tr, tr, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["top5"] is None
    human = run_cli("probe", "knn", tr, tr, "-q")
    assert human.exit_code == 0 and "top1" in human.stdout and "top5" not in human.stdout


@pytest.mark.slow
def test_knn_cli_raw_per_class(tmp_path, run_cli):
    rng = np.random.default_rng(2)
    imgs = rng.integers(0, 30, size=(60, 4, 4, 1)).astype(np.uint8)
    labels = np.arange(60) % 3
    for c in range(3):  # class c: a bright row c
        imgs[labels == c, c] += 200
    tr = write_dataset(tmp_path / "tr.zarr", imgs[:40], labels[:40], modality="image", class_names=["a", "b", "c"])
    te = write_dataset(tmp_path / "te.zarr", imgs[40:], labels[40:], modality="image", class_names=["a", "b", "c"])
    result = run_cli("probe", "knn", tr, te, "--raw", "--k", "5", "--per-class", "--json")
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["top1"] == 1.0 and out["k"] == 5 and out["dim"] == 16
    assert [row["name"] for row in out["per_class"]] == ["a", "b", "c"]
    human = run_cli("probe", "knn", tr, te, "--raw", "--k", "5", "--vote", "majority", "--per-class", "-q")
    assert human.exit_code == 0 and "top1" in human.stdout and "per class" in human.stdout


@pytest.mark.slow
def test_attentive_probe_learns_a_token_task(tmp_path, run_cli):
    # the class is which prototype hides in one random token among noise tokens: mean pooling
    # dilutes it, attention to the right token recovers it
    rng = np.random.default_rng(3)
    protos = rng.normal(size=(4, 16)) * 3

    def make(n):
        x = rng.normal(size=(n, 8, 16))
        y = rng.integers(0, 4, n)
        x[np.arange(n), rng.integers(0, 8, n)] += protos[y]
        return x.astype(np.float32), y

    x, y = make(1024)
    xt, yt = make(256)
    tr = write_dataset(tmp_path / "tr.zarr", x, y)
    te = write_dataset(tmp_path / "te.zarr", xt, yt)
    result = run_cli("probe", "attentive", tr, te, "--epochs", "20", "--batch-size", "64", "--json")
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["probe"] == "attentive" and out["tokens"] == 8
    assert out["top1"] > 0.75  # chance is 0.25


@pytest.mark.slow
def test_bad_inputs_exit_2_with_one_line(tmp_path, run_cli):
    rng = np.random.default_rng(4)
    a = write_dataset(tmp_path / "a.zarr", rng.normal(size=(30, 8)).astype(np.float32), np.arange(30) % 3)
    b = write_dataset(tmp_path / "b.zarr", rng.normal(size=(30, 6)).astype(np.float32), np.arange(30) % 3)
    nolab = write_dataset(tmp_path / "n.zarr", rng.normal(size=(30, 8)).astype(np.float32))
    img = write_dataset(tmp_path / "i.zarr", np.zeros((30, 2, 2, 1), np.uint8), np.arange(30) % 3, modality="image")
    assert_user_error(run_cli("probe", "linear", a, b), "dimensions differ", "8", "6")
    assert_user_error(run_cli("probe", "knn", a, nolab), "no labels")
    assert_user_error(run_cli("probe", "linear", img, img), "--raw")
    assert_user_error(run_cli("probe", "linear", tmp_path / "missing.zarr", a), "missing.zarr")


def provenance(**changes):
    base = {"run": "/runs/a", "step": 500, "weights": "target", "objective": "ijepa", "model": {"model": "tiny"},
            "source": "/data/train.zarr", "pool": "mean", "layers": "last", "encoder_sha256": "ab" * 32}
    return base | changes


@pytest.mark.slow
def test_sets_encoded_by_different_checkpoints_are_refused_naming_both(tmp_path, run_cli):
    x, y = separable(np.random.default_rng(5), 60)
    tr = write_dataset(tmp_path / "tr.zarr", x, y, provenance=provenance())
    te = write_dataset(tmp_path / "te.zarr", x, y, provenance=provenance(step=100, source="/data/test.zarr",
                                                                         encoder_sha256="cd" * 32))
    assert_user_error(run_cli("probe", "linear", tr, te), "tr.zarr and", "te.zarr were not encoded alike",
                      f'encoder_sha256 "{"ab" * 32}" vs "{"cd" * 32}"', "step 500 vs 100", "--allow-mismatch")


@pytest.mark.slow
def test_sets_encoded_with_other_pool_or_layers_are_refused(tmp_path, run_cli):
    x, y = separable(np.random.default_rng(5), 60)
    tr = write_dataset(tmp_path / "tr.zarr", x, y, provenance=provenance())
    te = write_dataset(tmp_path / "te.zarr", x, y, provenance=provenance(layers="last4", model={"model": "small"}))
    assert_user_error(run_cli("probe", "knn", tr, te), 'layers "last" vs "last4"',
                      'model {"model": "tiny"} vs {"model": "small"}')


@pytest.mark.slow
def test_sets_whose_class_names_differ_are_refused(tmp_path, run_cli):
    x, y = separable(np.random.default_rng(5), 60, num_classes=2)
    tr = write_dataset(tmp_path / "tr.zarr", x, y, class_names=["cat", "dog"])
    te = write_dataset(tmp_path / "te.zarr", x, y, class_names=["dog", "cat"])
    assert_user_error(run_cli("probe", "linear", tr, te), 'class_names ["cat", "dog"] vs ["dog", "cat"]')


@pytest.mark.slow
def test_allow_mismatch_probes_anyway_and_says_so(tmp_path, run_cli):
    x, y = separable(np.random.default_rng(5), 60)
    tr = write_dataset(tmp_path / "tr.zarr", x, y, provenance=provenance())
    te = write_dataset(tmp_path / "te.zarr", x, y, provenance=provenance(weights="context"))
    result = run_cli("probe", "knn", tr, te, "--allow-mismatch", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.strip() == 'jepa: warning: TRAIN and TEST were not encoded alike (weights "target" vs "context")'
    out = json.loads(result.stdout)
    assert out["encoding_mismatch"] == 'weights "target" vs "context"' and out["top1"] == 1.0


@pytest.mark.slow
def test_raw_sets_of_different_sample_shapes_are_refused(tmp_path, run_cli):
    labels = np.arange(30) % 3
    a = write_dataset(tmp_path / "a.zarr", np.zeros((30, 4, 8, 1), np.uint8), labels, modality="image")
    b = write_dataset(tmp_path / "b.zarr", np.zeros((30, 8, 4, 1), np.uint8), labels, modality="image")
    assert_user_error(run_cli("probe", "linear", a, b, "--raw"), "sample shapes differ", "[4, 8, 1]", "[8, 4, 1]")


@pytest.mark.slow
def test_raw_probe_of_real_images_against_generated_ones_ignores_the_sampler_provenance(tmp_path, run_cli):
    rng = np.random.default_rng(6)
    labels = np.arange(30) % 3
    images = rng.integers(0, 255, size=(30, 4, 4, 1)).astype(np.uint8)
    real = write_dataset(tmp_path / "real.zarr", images, labels, modality="image")
    samples = write_dataset(tmp_path / "samples.zarr", images, labels, modality="image",
                            provenance={"run": "runs/flow", "step": 100, "objective": "flow"})
    result = run_cli("probe", "knn", real, samples, "--raw", "--json")
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["encoding_mismatch"] is None and out["n_test"] == 30


@pytest.mark.slow
def test_raw_sets_of_different_modalities_are_refused(tmp_path, run_cli):
    labels = np.arange(30) % 3
    a = write_dataset(tmp_path / "a.zarr", np.zeros((30, 16), np.uint8), labels, modality="image")
    b = write_dataset(tmp_path / "b.zarr", np.zeros((30, 16), np.float32), labels, modality="latent")
    assert_user_error(run_cli("probe", "linear", a, b, "--raw"), "modalities differ", "'image'", "'latent'")


@pytest.mark.slow
def test_a_redirected_stderr_gets_plain_progress_lines_for_each_probe(tmp_path, run_cli, monkeypatch):
    from jepa_cli.cli.common import ProgressHandle

    monkeypatch.setattr(ProgressHandle, "PLAIN_AFTER_S", 0.0)  # lines from the start (10 s by default)
    rng = np.random.default_rng(0)
    x, y = separable(rng, 200)
    xt, yt = separable(rng, 100)
    tr = write_dataset(tmp_path / "tr.zarr", x, y)
    te = write_dataset(tmp_path / "te.zarr", xt, yt)
    linear = run_cli("probe", "linear", tr, te)
    assert linear.exit_code == 0, linear.stderr
    assert [line.split(",")[0] for line in linear.stderr.splitlines()] == [
        f"linear probe: {n}/6 fits" for n in range(1, 7)]
    knn = run_cli("probe", "knn", tr, te, "--batch-size", "50")
    assert [line.split(",")[0] for line in knn.stderr.splitlines()] == ["k-NN probe: 50/100 rows",
                                                                         "k-NN probe: 100/100 rows"]
    assert run_cli("probe", "knn", tr, te, "-q").stderr == ""
