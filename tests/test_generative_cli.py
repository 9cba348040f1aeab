"""`jepa train --objective flow`, `jepa sample` and `jepa fd` end to end on a tiny labelled dataset
(one short run shared by the module), and their refusals."""

from __future__ import annotations

import json
import math

import jax
import numpy as np
import pytest
import scipy.linalg
from conftest import assert_user_error

from jepa_cli.data import atomic, store
from jepa_cli.evaluation.fd import frechet_distance

RECIPE = """objective = "flow"
lr = 1e-3
start_lr = 1e-3
final_lr = 1e-3
warmup_steps = 0
wd = 0.0
final_wd = 0.0
[flow]
width = 32
depth = 1
heads = 2
patch_size = 4
ema_decay = 0.75
"""


def _images(path, n, labels=True, seed=0):
    rng = np.random.default_rng(seed)
    store.write_group(path, store.base_attributes("dataset", modality="image", layout="NHWC",
                                                  class_names=["a", "b", "c"] if labels else []))
    store.write_array(path / "inputs", rng.integers(0, 256, (n, 8, 8, 1), dtype=np.uint8))
    if labels:
        store.write_array(path / "labels", (np.arange(n) % 3).astype(np.int32))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from click.testing import CliRunner

    from jepa_cli.cli.main import cli

    d = tmp_path_factory.mktemp("gen")
    data = _images(d / "d.zarr", 24)
    (d / "flow.toml").write_text(RECIPE)
    result = CliRunner().invoke(cli, ["train", "--config", str(d / "flow.toml"), "--data", str(data), "--out",
                                      str(d / "run"), "--steps", "1", "--batch-size", "8", "--mesh", "data=2",
                                      "--cond-drop", "0.2", "--json", "-q"], catch_exceptions=False,
                                env={"JEPA_DEBUG": "1"})  # an unexpected error raises with its traceback
    assert result.exit_code == 0, result.output
    return d, data, d / "run"


@pytest.mark.slow
def test_train_takes_classes_and_options_from_one_declaration(trained):
    d, _, run = trained
    record = json.loads((run / "run.json").read_text())
    oc = record["config"]["objective_config"]
    assert (oc["num_classes"], oc["image_size"], oc["channels"], oc["modality"]) == (3, 8, 1, "image")
    assert (oc["cond_drop"], oc["ema_decay"], oc["flow_shift"]) == (0.2, 0.75, 1.0)  # flag, recipe, default


@pytest.mark.slow
def test_ema_averages_every_parameter(trained):
    """After one update: ema = 0.75 params_0 + 0.25 params_1 (init_state's init key is split(seed)[0])."""
    from jepa_cli.training.run import load_run

    _, _, run = trained
    _, obj, host, step = load_run(run)
    p0 = obj.init(jax.random.split(jax.random.PRNGKey(0))[0])
    assert step == 1
    jax.tree.map(lambda e, a, b: np.testing.assert_allclose(e, 0.75 * np.asarray(a) + 0.25 * b, atol=1e-6),
                 host["ema"], p0, host["params"])


@pytest.mark.slow
def test_sample_writes_a_labelled_uint8_dataset_with_its_parameters(trained, run_cli):
    d, _, run = trained
    out = d / "s.zarr"
    r = run_cli("sample", run, "-n", "3", "--class", "2", "--class", "0", "-o", out, "--guidance-scale", "2",
                "--guidance-interval", "0.2,0.9", "--steps", "3", "--batch-size", "4", "--mesh", "data=2",
                "--png", d / "s.png", "--json", "-q")
    assert r.exit_code == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["num_samples"] == 6 and summary["shape"] == [6, 8, 8, 1]
    attrs = store.read_attributes(out)
    assert attrs["modality"] == "image" and attrs["class_names"] == ["a", "b", "c"]
    assert attrs["sampling"]["guidance_interval"] == [0.2, 0.9] and attrs["sampling"]["steps"] == 3
    assert attrs["provenance"]["step"] == 1 and attrs["provenance"]["objective"] == "flow"
    assert store.read_array(out / "inputs").dtype == np.uint8
    np.testing.assert_array_equal(store.read_array(out / "labels"), [2, 2, 2, 0, 0, 0])
    assert (d / "s.png").read_bytes().startswith(atomic.PNG_MAGIC)


@pytest.mark.slow
def test_sample_png_shows_the_first_ten_samples_of_each_class_read_back_from_the_output(trained, run_cli):
    from PIL import Image

    d, _, run = trained
    out, png = d / "grid.zarr", d / "grid.png"
    r = run_cli("sample", run, "-n", "12", "--classes", "all", "-o", out, "--steps", "2", "--batch-size", "8",
                "--mesh", "data=1", "--png", png, "-q")
    assert r.exit_code == 0, r.stderr
    labels = store.read_array(out / "labels")
    assert len(labels) == 36 and sorted(set(labels.tolist())) == [0, 1, 2]
    samples = store.read_array(out / "inputs")
    picture = np.asarray(Image.open(png))
    # 3 classes x 10 tiles of 32 + 2x2 pixels of border, after the column of class labels
    assert picture.shape[0] == 3 * 36 and picture.shape[1] > 10 * 36
    left = picture.shape[1] - 10 * 36
    for k in range(3):
        for j, i in enumerate(np.flatnonzero(labels == k)[:10]):
            tile = picture[k * 36 + 2:k * 36 + 34, left + j * 36 + 2:left + j * 36 + 34]
            # the 8x8 sample, each pixel a 4x4 square, grey in R, G and B
            np.testing.assert_array_equal(tile, np.repeat(np.repeat(samples[i], 4, axis=0), 4, axis=1).repeat(3, -1))
    assert (picture[:, left:][:, ::36] == 255).all()  # white borders between tiles


def test_sample_png_labels_each_class_row_with_its_id_and_name():
    from jepa_cli.sampling.run import class_label, grid_picture

    images = np.zeros((4, 8, 8, 1), np.uint8)
    picture = grid_picture(images, np.array([0, 0, 2, 2]), per_row=2, names=["zero", "one", "two"])
    assert class_label(2, ["zero", "one", "two"]) == "2 two" and class_label(5, None) == "5"
    label_width = picture.shape[1] - 2 * 36
    assert picture.shape[0] == 2 * 36 and label_width > 0  # rows for classes 0 and 2 only
    column = picture[:, :label_width]
    assert (column[:36] < 128).any() and (column[36:] < 128).any()  # dark text on both rows' white labels
    assert not np.array_equal(column[:36], column[36:])  # "0 zero" and "2 two" differ
    assert grid_picture(images, None, per_row=2).shape == (36, 2 * 36, 3)  # unlabelled: no label column


@pytest.mark.slow
def test_sample_of_absurdly_many_is_refused_before_anything_of_that_size_exists(trained, run_cli):
    d, _, run = trained
    r = run_cli("sample", run, "-n", str(10**15), "-o", d / "huge.zarr", "--steps", "2")
    assert_user_error(r, "huge.zarr: needs about", "pass a smaller")
    assert not (d / "huge.zarr").exists()


@pytest.mark.slow
def test_weights_samples_with_the_ema_or_the_online_parameters(trained, tmp_path):
    """After one update at ema_decay 0.75 the two differ; each sample records the digest of what it used."""
    from jepa_cli.sampling.run import sample_run
    from jepa_cli.training.run import load_run, params_sha256

    _, _, run = trained
    host = load_run(run)[2]
    samples = {}
    for weights, tree in (("ema", host["ema"]), ("online", host["params"])):
        sample_run(run, tmp_path / weights, n=4, steps=2, batch_size=4, mesh=None, weights=weights)
        assert store.read_attributes(tmp_path / weights)["provenance"]["params_sha256"] == params_sha256(tree)
        samples[weights] = store.read_array(tmp_path / weights / "inputs").astype(int)
    assert np.abs(samples["ema"] - samples["online"]).mean() > 0.5  # measured 1.9 grey levels apart on average


class Interrupt(Exception):
    pass


SAMPLE_KW = dict(n=10, all_classes=True, steps=2, batch_size=4, mesh=None)  # 30 samples, batches of 4


@pytest.mark.slow
def test_an_interrupted_sample_resumes_to_the_bytes_of_an_uninterrupted_one(trained, tmp_path, monkeypatch):
    from jepa_cli.data.resumable import partial_path
    from jepa_cli.sampling import run as sampling_run

    _, _, run = trained
    monkeypatch.setattr(sampling_run.store, "chunk_rows", lambda shape, itemsize: 8)  # units of 2 batches
    whole = sampling_run.sample_run(run, tmp_path / "whole.zarr", **SAMPLE_KW)
    seen = []

    def stop_in_the_third_unit(rows):
        seen.append(rows)
        if sum(seen) == 20:  # 5 batches drawn: units 0 and 1 written, unit 2 half done
            raise Interrupt

    out = tmp_path / "resumed.zarr"
    with pytest.raises(Interrupt):
        sampling_run.sample_run(run, out, on_progress=stop_in_the_third_unit, **SAMPLE_KW)
    assert not out.exists() and sorted(p.name for p in (partial_path(out) / "progress").iterdir()) == \
        ["00000000.npz", "00000001.npz"]
    drawn, started = [], []
    resumed = sampling_run.sample_run(run, out, on_progress=drawn.append, on_start=lambda *a: started.append(a),
                                      **SAMPLE_KW)
    assert whole["samples_resumed"] == 0 and resumed["samples_resumed"] == 16 and sum(drawn) == 30 - 16
    assert started == [(30, 16)]
    assert not partial_path(out).exists()
    for name in ("inputs", "labels"):
        np.testing.assert_array_equal(store.read_array(out / name), store.read_array(tmp_path / "whole.zarr" / name))
    assert store.read_attributes(out) == store.read_attributes(tmp_path / "whole.zarr")


@pytest.mark.slow
def test_a_partial_sample_of_other_parameters_is_discarded_not_mixed(trained, tmp_path, monkeypatch):
    from jepa_cli.data.resumable import partial_path
    from jepa_cli.sampling import run as sampling_run

    _, _, run = trained
    monkeypatch.setattr(sampling_run.store, "chunk_rows", lambda shape, itemsize: 8)

    seen = []

    def stop_after_a_unit(rows):
        seen.append(rows)
        if sum(seen) >= 8:
            raise Interrupt

    out = tmp_path / "s.zarr"
    with pytest.raises(Interrupt):
        sampling_run.sample_run(run, out, on_progress=stop_after_a_unit, **SAMPLE_KW)
    logs = []
    other = sampling_run.sample_run(run, out, on_log=logs.append, **(SAMPLE_KW | {"seed": 1}))
    fresh = sampling_run.sample_run(run, tmp_path / "fresh.zarr", **(SAMPLE_KW | {"seed": 1}))
    assert other["samples_resumed"] == 0
    assert logs == [f"discarding the partial output {partial_path(out)}: it was started by another job"]
    np.testing.assert_array_equal(store.read_array(out / "inputs"), store.read_array(tmp_path / "fresh.zarr" / "inputs"))


@pytest.mark.slow
def test_sigterm_during_sample_exits_143_keeps_the_partial_and_the_rerun_resumes_to_the_same_bytes(trained, tmp_path,
                                                                                                run_cli):
    """The real CLI, held once its one unit of samples is recorded: SIGTERM exits 143 in one line and
    keeps the partial; the rerun draws nothing and writes what an uninterrupted run writes."""
    import signal

    from adversarial import start_held

    _, _, run = trained
    args = ["sample", run, "-n", "8", "--steps", "1", "--batch-size", "4", "--mesh", "data=1", "-q"]
    assert run_cli(*args, "-o", tmp_path / "whole.zarr").exit_code == 0
    out, partial = tmp_path / "s.zarr", tmp_path / ".s.zarr.partial"
    process = start_held(tmp_path / "held", "jepa_cli.data.resumable:mark_unit", "after", *args, "-o", out)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143 and stderr.decode().splitlines() == ["jepa: error: terminated (SIGTERM)"]
    assert partial.is_dir() and not out.exists()
    resumed = run_cli(*args, "-o", out, "--json")
    assert resumed.exit_code == 0, resumed.stderr
    assert json.loads(resumed.stdout)["samples_resumed"] == 8
    np.testing.assert_array_equal(store.read_array(out / "inputs"), store.read_array(tmp_path / "whole.zarr" / "inputs"))


@pytest.mark.slow
def test_a_second_sample_into_an_output_being_written_is_refused(trained, tmp_path, run_cli):
    import subprocess
    import sys

    from adversarial import snapshot

    _, _, run = trained
    partial = tmp_path / ".s.zarr.partial"
    holder = subprocess.Popen(  # a first `jepa sample` at work, as the kernel sees it: the partial, locked
        [sys.executable, "-c", "import fcntl, os, time\n"
         f"os.mkdir({str(partial)!r}); fd = os.open({str(partial)!r}, os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX)\n"
         "print('held', flush=True); time.sleep(600)"], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"held\n"
        before = snapshot([tmp_path])
        r = run_cli("sample", run, "-n", "2", "-o", tmp_path / "s.zarr", "--steps", "2", "--mesh", "data=1")
        assert_user_error(r, f"{tmp_path / 's.zarr'}: another process is writing it now")
        assert snapshot([tmp_path]) == before
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
@pytest.mark.parametrize("args, fragment", [
    (("--class", "3"), "class 3 is not one the model knows"),
    (("--guidance-interval", "0.8,0.2"), "LO <= HI"),
    (("--guidance-interval", "0.1,2"), "outside the flow noise levels"),
    (("--sampler", "ddim", "--classes", "everything"), "--classes"),
    (("--sampler", "ddim", "--eta", "nan"), "--eta must be a number in [0, 1], got nan"),
    (("--sampler", "ddim", "--eta", "-1"), "'--eta': -1.0 is not in the range 0.0<=x<=1.0"),
    (("--sampler", "ddim", "--eta", "5"), "'--eta': 5.0 is not in the range 0.0<=x<=1.0"),
    (("--guidance-scale", "1e30"), "'--guidance-scale': 1e+30 is not in the range 0.0<=x<=100.0"),
    (("--guidance-scale", "nan"), "--guidance-scale must be a number in [0, 100], got nan"),
    (("--steps", "1000000000"), "'--steps': 1000000000 is not in the range 1<=x<=10000"),
    (("-n", "0"), "'-n': 0 is not in the range x>=1"),
    (("--batch-size", "0"), "'--batch-size': 0 is not in the range x>=1"),
])
def test_sample_refusals_are_one_line_and_write_nothing(trained, run_cli, args, fragment):
    d, _, run = trained
    r = run_cli("sample", run, "-n", "2", "-o", d / "bad.zarr", "--steps", "2", *args)
    assert_user_error(r, fragment)
    assert not (d / "bad.zarr").exists()


@pytest.mark.slow
@pytest.mark.parametrize("objective, named", [("ijepa", "'ijepa'"), (["flow"], "['flow']")])
def test_sampling_a_run_of_no_generative_objective_is_refused(tmp_path, run_cli, objective, named):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"config": {"objective": objective}, "lengths": {"steps": 1}}))
    assert_user_error(run_cli("sample", run, "-o", tmp_path / "s.zarr"), f"objective {named} is not generative")


@pytest.mark.slow
def test_fd_of_a_set_with_itself_is_zero(trained, run_cli):
    _, data, _ = trained
    r = run_cli("fd", data, data, "--json")
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["n_a"] == 24 and out["dim"] == 64 and abs(out["fd"]) < 1e-9


def test_fd_matches_scipy_on_gaussians_with_known_covariance():
    """Heusel et al. 2017: |mu_a - mu_b|^2 + tr(S_a + S_b - 2 sqrtm(S_a S_b)), against scipy.linalg.sqrtm."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 5)), rng.standard_normal((5, 5))
    cov_a, cov_b = a @ a.T + 0.1 * np.eye(5), b @ b.T + 0.1 * np.eye(5)
    mu_a, mu_b = rng.standard_normal(5), rng.standard_normal(5)
    expected = np.sum((mu_a - mu_b) ** 2) + np.trace(cov_a + cov_b - 2 * scipy.linalg.sqrtm(cov_a @ cov_b).real)
    assert frechet_distance(mu_a, cov_a, mu_b, cov_b) == pytest.approx(expected, rel=1e-9)
    # the same cov: only the means differ
    assert frechet_distance(mu_a, cov_a, mu_b, cov_a) == pytest.approx(np.sum((mu_a - mu_b) ** 2), rel=1e-9)


@pytest.mark.slow
def test_fd_refuses_different_dimensions_and_single_samples(tmp_path, run_cli):
    a = _images(tmp_path / "a.zarr", 4)
    b = tmp_path / "b.zarr"
    store.write_group(b, store.base_attributes("dataset", modality="latent", layout="ND", class_names=[]))
    store.write_array(b / "inputs", np.zeros((4, 7), np.float32))
    assert_user_error(run_cli("fd", a, b), "64-dimensional", "7")
    one = _images(tmp_path / "one.zarr", 1, labels=False)
    assert_user_error(run_cli("fd", a, one), "at least 2 samples")


def test_classes_on_an_unconditional_model_are_refused():
    from jepa_cli.errors import InputError
    from jepa_cli.objectives import make_objective
    from jepa_cli.sampling.run import resolve_labels

    obj = make_objective("flow", {"num_classes": 0})
    assert resolve_labels(obj, 5, None, False, "run") is None  # unconditional: no labels
    with pytest.raises(InputError, match="unconditional"):
        resolve_labels(obj, 5, None, True, "run")
    conditional = make_objective("flow", {"num_classes": 3})
    np.testing.assert_array_equal(resolve_labels(conditional, 4, None, False, "run"), [0, 1, 2, 0])


@pytest.mark.slow
def test_sample_force_replaces_an_earlier_sample_and_leaves_no_partial(trained, tmp_path, run_cli):
    _, _, run = trained
    out = tmp_path / "s.zarr"
    args = ("sample", run, "-n", "2", "-o", out, "--steps", "2", "--mesh", "data=1", "-q")
    assert run_cli(*args, "--seed", "1").exit_code == 0
    r = run_cli(*args, "--seed", "2", "--force")
    assert r.exit_code == 0, r.stderr
    assert store.read_attributes(out)["sampling"]["seed"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]


@pytest.mark.slow
def test_sample_show_of_fewer_than_four_samples_previews_each(trained, tmp_path, run_cli):
    _, _, run = trained
    r = run_cli("sample", run, "-n", "2", "-o", tmp_path / "s.zarr", "--steps", "2", "--mesh", "data=1", "--show",
                "-q")
    assert r.exit_code == 0, r.stderr
    assert [line for line in r.stdout.splitlines() if line.startswith("class ")] == \
        ["class 0 a: sample 0", "class 1 b: sample 1"]


@pytest.mark.slow
def test_sample_show_previews_the_first_four_samples_of_every_class_side_by_side(trained, tmp_path, run_cli):
    _, _, run = trained
    r = run_cli("sample", run, "-n", "5", "--classes", "all", "-o", tmp_path / "s.zarr", "--steps", "2",
                "--mesh", "data=1", "--show", "-q")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line for line in lines if line.startswith("class ")] == \
        ["class 0 a: samples 0, 1, 2, 3", "class 1 b: samples 5, 6, 7, 8", "class 2 c: samples 10, 11, 12, 13"]
    first = lines.index("class 0 a: samples 0, 1, 2, 3")
    assert len(lines[first + 1]) == 4 * 16 + 3 * 2  # four 8-pixel tiles of 2 characters a pixel, 2 apart


@pytest.mark.slow
def test_guidance_interval_at_scale_1_warns_that_it_changes_nothing(trained, tmp_path, run_cli):
    _, _, run = trained
    r = run_cli("sample", run, "-n", "2", "-o", tmp_path / "s.zarr", "--steps", "2", "--mesh", "data=1",
                "--guidance-interval", "0.2,0.8")
    assert r.exit_code == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("jepa: warning")]  # not progress lines
    assert warnings == ["jepa: warning: --guidance-interval 0.2,0.8 has no effect at --guidance-scale 1 "
                        "(no guidance); give a scale other than 1, e.g. --guidance-scale 2"]
    guided = run_cli("sample", run, "-n", "2", "-o", tmp_path / "g.zarr", "--steps", "2", "--mesh", "data=1",
                     "--guidance-interval", "0.2,0.8", "--guidance-scale", "2")
    assert guided.exit_code == 0 and "jepa: warning" not in guided.stderr


@pytest.mark.slow
def test_sample_png_at_the_output_path_is_refused_before_sampling(trained, tmp_path, run_cli):
    _, _, run = trained
    out = tmp_path / "s.zarr"
    r = run_cli("sample", run, "-n", "2", "-o", out, "--png", out, "--steps", "2")
    assert_user_error(r, f"{out}: --png is or lies in the -o output")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_class_named_twice_is_sampled_n_times_not_2n(trained, tmp_path, run_cli):
    _, _, run = trained
    out = tmp_path / "s.zarr"
    r = run_cli("sample", run, "-n", "2", "--class", "1", "--class", "1", "-o", out, "--steps", "2",
                "--mesh", "data=1", "-q")
    assert r.exit_code == 0, r.stderr
    np.testing.assert_array_equal(store.read_array(out / "labels"), [1, 1])
    assert store.read_attributes(out)["sampling"]["n"] == 2


@pytest.mark.slow
def test_non_finite_samples_are_refused_and_nothing_stays_on_disk(trained, tmp_path, monkeypatch):
    from jepa_cli.errors import InputError
    from jepa_cli.sampling import run as sampling_run

    _, _, run = trained

    def nan_batches(objective, params, labels, **kw):
        yield 0, np.full((len(labels), *objective.sample_shape), np.nan, np.float32)

    monkeypatch.setattr(sampling_run, "sample_batches", nan_batches)
    with pytest.raises(InputError, match="batch 0 of the samples is not finite"):
        sampling_run.sample_run(run, tmp_path / "s.zarr", n=2, steps=2, mesh=None)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_sample_whose_output_appeared_meanwhile_keeps_that_output_and_leaves_no_partial(trained, tmp_path):
    from jepa_cli.errors import InputError
    from jepa_cli.sampling import run as sampling_run

    _, _, run = trained
    out = tmp_path / "s.zarr"

    def another_writer_finishes_first(total, drawn):
        store.write_group(out, store.base_attributes("dataset", modality="image", layout="NHWC", class_names=[]))

    with pytest.raises(InputError, match="another process wrote it while this command ran"):
        sampling_run.sample_run(run, out, n=2, steps=2, mesh=None, on_start=another_writer_finishes_first)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"] and not (out / "inputs").exists()


def _latents(path, n=16, dim=8):
    """A latent dataset as encode-latents writes it: [N, D] float32 with its per-channel shift and scale."""
    z = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32) * 0.002 + 0.1
    store.write_group(path, store.base_attributes("dataset", modality="latent", layout="ND", class_names=[],
                                                  latent_shift=[0.1] * dim, latent_scale=[500.0] * dim))
    store.write_array(path / "inputs", z)
    return path


@pytest.mark.slow
def test_edm_print_config_shows_the_sigma_data_and_preset_taken_from_latents(tmp_path, run_cli):
    import tomllib

    data = _latents(tmp_path / "z.zarr")
    r = run_cli("train", "--objective", "diffusion", "--schedule", "edm", "--data", data, "-o", tmp_path / "run",
                "--batch-size", "8", "--steps", "1", "--print-config")
    assert r.exit_code == 0, r.stderr
    table = tomllib.loads(r.stdout)["diffusion"]
    # EDM2's P_mean -0.4 is for sigma_data 0.5: at 1.0 the same sigma / sigma_data is P_mean -0.4 + ln 2
    assert (table["sigma_data"], table["edm_preset"], table["p_mean"], table["p_std"]) == \
        (1.0, "edm2-latent", pytest.approx(-0.4 + math.log(2)), 1.0)
    assert table["edm_logvar"] is False
