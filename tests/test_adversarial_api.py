"""jepa_cli.api given what a notebook may hand it by mistake: pixels on another scale, NaN, a
missing channel axis, labels that do not fit int32, arguments of the wrong type. Each is refused
with a one-line InputError naming what is wrong, never answered with other embeddings; and loading a
run writes nothing of orbax's on stderr."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from test_api import _one_line
from test_encode import image_dataset
from test_export import OFFICIAL, TINY, _cli

from jepa_cli import api
from jepa_cli.data import store

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The official tiny checkpoint imported as a run (32 px RGB, step 30) and 6 RGB images of it."""
    root = tmp_path_factory.mktemp("adversarial_api")
    run, data = root / "run", image_dataset(root / "data.zarr", n=6, size=32, channels=3)
    assert _cli("import-checkpoint", OFFICIAL, "-o", run, *TINY, "-q").exit_code == 0
    return run, data


@pytest.fixture(scope="module")
def loaded(setup):
    """The run loaded once, its images (uint8 [6, 32, 32, 3]) and their embeddings."""
    run = api.load_run(setup[0])
    x = api.load_dataset(setup[1]).inputs
    return run, x, run.encode(x)


def _refused(call, *fragments: str) -> str:
    with pytest.raises(api.InputError) as caught:
        call()
    _one_line(caught.value, *fragments)
    return str(caught.value)


def test_float_pixels_in_0_1_give_the_embeddings_of_the_uint8_pixels_they_stand_for(loaded):
    run, x, z = loaded
    as_float = x.astype(np.float32) / 255  # round(v / 255 * 255) == v for every uint8 v
    assert np.array_equal(run.encode(as_float), z)


def test_float_pixels_above_1_are_refused_saying_the_range_and_the_uint8_alternative(loaded):
    run, x, _ = loaded
    _refused(lambda: run.encode(x.astype(np.float32)), "[0, 1]", f"max {int(x.max())}", "uint8")


def test_samples_holding_nan_or_inf_are_refused_saying_how_many(loaded):
    run, x, _ = loaded
    bad = x.astype(np.float32) / 255
    bad[1, 0, 0, 0], bad[4, 5, 5, 2] = np.nan, np.inf
    _refused(lambda: run.encode(bad), "2 of the 6 samples hold NaN or inf")


def test_embeddings_that_hold_nan_are_refused_saying_how_many(setup):
    run = api.load_run(setup[0])
    final_norm = run.encoder_params["norm"]
    final_norm["bias"] = np.full_like(final_norm["bias"], np.nan)  # every token of every sample turns NaN
    x = api.load_dataset(setup[1]).inputs
    _refused(lambda: run.encode(x), "non-finite embeddings", "for 6 of the 6 samples")


def test_images_without_a_channel_axis_are_refused_naming_the_shape_expected(loaded):
    run, x, _ = loaded
    _refused(lambda: run.encode(x[..., 0]), "images must be [N, H, W, 3]", "got shape [6, 32, 32]")


def _with_labels(path: Path, labels: np.ndarray) -> Path:
    image_dataset(path, n=6, size=8, channels=1, labels=False)
    store.write_array(path / "labels", labels)
    return path


def test_labels_that_do_not_fit_int32_are_refused(tmp_path):
    labels = np.array([0, 1, 2, 0, 1, 2**32 + 5], np.int64)  # a cast to int32 would read the last as 5
    path = _with_labels(tmp_path / "wide.zarr", labels)
    _refused(lambda: api.load_dataset(path), str(path), "fit int32", f"max {2**32 + 5}")


def test_labels_that_are_not_integers_are_refused(tmp_path):
    path = _with_labels(tmp_path / "float.zarr", np.array([0, 1, 2, 0, 1, 2.7], np.float32))
    _refused(lambda: api.load_dataset(path), "labels must be integer class indices", "float32")


def test_labels_whose_count_differs_from_the_samples_are_refused(tmp_path):
    path = _with_labels(tmp_path / "short.zarr", np.arange(4, dtype=np.int32))
    _refused(lambda: api.load_dataset(path), "inputs has 6 samples but labels has 4")


@pytest.mark.parametrize("call, message", [
    (lambda run: api.load_run(None), "path must be a path (a str or os.PathLike), got None"),
    (lambda run: api.load_run(3), "path must be a path (a str or os.PathLike), got 3"),
    (lambda run: api.load_dataset(None), "path must be a path (a str or os.PathLike), got None"),
    (lambda run: api.load_dataset(["a.zarr"]), "path must be a path (a str or os.PathLike), got list"),
    (lambda run: api.load_run(run, weights=None), "weights must be one of target, context, got None"),
])
def test_arguments_of_the_wrong_type_are_refused_naming_the_argument_and_what_it_must_be(setup, call, message):
    with pytest.raises(api.InputError) as caught:
        call(setup[0])
    assert str(caught.value) == message


def test_loading_a_run_writes_no_orbax_warning_and_keeps_the_users_own_logging(setup):
    script = ("import logging, sys\n"
              "from jepa_cli import api\n"
              "api.load_run(sys.argv[1])\n"  # the first load reads a checkpoint with orbax
              "try:\n"
              "    api.load_run(sys.argv[1], step=7)\n"
              "except api.InputError as exc:\n"
              "    print(exc, file=sys.stderr)\n"
              "logging.getLogger('notebook').warning('the user record')\n")
    done = subprocess.run([sys.executable, "-c", script, str(setup[0])], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "absl" not in done.stderr and "Type handler registry" not in done.stderr
    error, user = done.stderr.splitlines()
    assert error == f"{setup[0]}: no checkpoint at step 7 (checkpoints: 30)" and user.endswith("the user record")
