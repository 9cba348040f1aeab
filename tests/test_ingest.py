"""`jepa ingest` and `jepa info` on datasets: the dataset contract of docs/formats.md."""

import gzip
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import assert_user_error, nothing_written
from conftest import read_zarr as read
from conftest import zarr_attributes as group_attributes


def write_idx(path: Path, array: np.ndarray, magic_type: int = 0x08) -> None:
    header = struct.pack(">HBB", 0, magic_type, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


@pytest.fixture
def class_folder(tmp_path: Path) -> Path:
    root = tmp_path / "pets"
    rng = np.random.default_rng(0)
    for name, count in (("cat", 3), ("dog", 2)):
        (root / name).mkdir(parents=True)
        for i in range(count):
            Image.fromarray(rng.integers(0, 255, (12, 10, 3), dtype=np.uint8)).save(root / name / f"{i}.png")
    return root


@pytest.mark.slow
def test_png_class_folder_gives_labels_from_sorted_subfolders(run_cli, class_folder, tmp_path):
    out = tmp_path / "pets.zarr"
    result = run_cli("ingest", class_folder, out, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["shape"] == [5, 12, 10, 3]
    assert read(out / "inputs").dtype == np.uint8
    assert read(out / "labels").tolist() == [0, 0, 0, 1, 1]
    attrs = group_attributes(out)
    assert attrs["class_names"] == ["cat", "dog"]
    assert (attrs["modality"], attrs["layout"], attrs["jepa_kind"]) == ("image", "NHWC", "dataset")
    first = np.asarray(Image.open(class_folder / "cat" / "0.png"))
    assert np.array_equal(read(out / "inputs")[0], first)


@pytest.mark.slow
def test_flat_folder_is_unlabelled(run_cli, class_folder, tmp_path):
    out = tmp_path / "flat.zarr"
    assert run_cli("ingest", class_folder / "cat", out).exit_code == 0
    assert not (out / "labels").exists()
    assert group_attributes(out)["class_names"] == []


@pytest.mark.slow
def test_npz_with_labels_key(run_cli, tmp_path):
    images = np.arange(4 * 6 * 6, dtype=np.uint8).reshape(4, 6, 6)
    np.savez(tmp_path / "a.npz", images=images, labels=np.array([2, 0, 1, 2]))
    out = tmp_path / "a.zarr"
    assert run_cli("ingest", tmp_path / "a.npz", out).exit_code == 0
    assert read(out / "inputs").shape == (4, 6, 6, 1)
    assert np.array_equal(read(out / "inputs")[..., 0], images)
    assert read(out / "labels").tolist() == [2, 0, 1, 2]
    assert group_attributes(out)["class_names"] == ["0", "1", "2"]


@pytest.mark.slow
def test_gzipped_idx_images_with_idx_labels(run_cli, tmp_path):
    images = np.random.default_rng(1).integers(0, 255, (7, 28, 28), dtype=np.uint8)
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", images)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.arange(7) % 3)
    out = tmp_path / "mnist.zarr"
    result = run_cli("ingest", tmp_path / "t10k-images-idx3-ubyte.gz", out, "--labels", tmp_path / "t10k-labels-idx1-ubyte.gz")
    assert result.exit_code == 0, result.stderr
    assert np.array_equal(read(out / "inputs")[..., 0], images)
    assert read(out / "labels").tolist() == [0, 1, 2, 0, 1, 2, 0]


@pytest.mark.slow
def test_builtin_digits_is_the_1797_real_digits(run_cli, tmp_path):
    out = tmp_path / "digits.zarr"
    assert run_cli("ingest", "builtin:digits", out).exit_code == 0
    inputs, labels = read(out / "inputs"), read(out / "labels")
    assert inputs.shape == (1797, 8, 8, 1) and labels.dtype == np.int32
    assert np.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert inputs.max() == 255 and inputs.min() == 0
    assert group_attributes(out)["source"] == "builtin:digits"


@pytest.mark.slow
def test_zarr_python_reads_the_dataset(run_cli, tmp_path):
    import zarr

    out = tmp_path / "digits.zarr"
    run_cli("ingest", "builtin:digits", out, "--limit", "10")
    group = zarr.open_group(str(out), mode="r")
    assert group["inputs"].shape == (10, 8, 8, 1)
    assert group.attrs["class_names"][:3] == ["0", "1", "2"]
    assert np.array_equal(group["labels"][:], read(out / "labels"))


@pytest.mark.slow
def test_splits_are_disjoint_stratified_and_cover_the_source(run_cli, tmp_path):
    for split in ("train", "test"):
        result = run_cli("ingest", "builtin:digits", tmp_path / f"{split}.zarr", "--split", split,
                         "--test-fraction", "0.25", "--seed", "3", "--json")
        assert result.exit_code == 0, result.stderr
    train, test = read(tmp_path / "train.zarr" / "inputs"), read(tmp_path / "test.zarr" / "inputs")
    assert len(train) + len(test) == 1797
    assert len(test) == 450  # sum over classes of round(0.25 * n_c), Python's round-half-even
    test_counts = np.bincount(read(tmp_path / "test.zarr" / "labels"))
    assert test_counts.min() >= 43 and test_counts.max() <= 46  # every class ~25 %


def test_split_indices_are_disjoint_and_cover_every_sample():
    from jepa_cli.data.splits import split_indices

    labels = np.arange(103) % 4
    train = split_indices(labels, 103, "train", 0.3, seed=5)
    test = split_indices(labels, 103, "test", 0.3, seed=5)
    assert np.intersect1d(train, test).size == 0
    assert np.array_equal(np.union1d(train, test), np.arange(103))
    assert np.bincount(labels[test]).tolist() == [8, 8, 8, 8]  # round(0.3 * 26) and round(0.3 * 25)


@pytest.mark.slow
def test_split_is_deterministic_for_a_seed(run_cli, tmp_path):
    for name in ("a", "b"):
        run_cli("ingest", "builtin:digits", tmp_path / f"{name}.zarr", "--split", "test", "--seed", "7")
    assert np.array_equal(read(tmp_path / "a.zarr" / "inputs"), read(tmp_path / "b.zarr" / "inputs"))


@pytest.mark.slow
def test_size_resizes_with_center_crop_and_channels_convert(run_cli, tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    Image.new("L", (20, 10), 255).save(folder / "wide.png")
    Image.new("RGB", (8, 16), (255, 0, 0)).save(folder / "tall.png")
    out = tmp_path / "mixed.zarr"
    assert run_cli("ingest", folder, out, "--size", "6x6", "--channels", "3").exit_code == 0
    inputs = read(out / "inputs")
    assert inputs.shape == (2, 6, 6, 3)
    assert inputs[0].tolist() == [[[255, 0, 0]] * 6] * 6  # tall.png sorts first; pure red stays red


@pytest.mark.slow
def test_limit_keeps_the_first_samples(run_cli, tmp_path):
    out = tmp_path / "few.zarr"
    assert run_cli("ingest", "builtin:digits", out, "--limit", "5").exit_code == 0
    assert read(out / "labels").tolist() == [0, 1, 2, 3, 4]


@pytest.mark.slow
def test_options_read_jepa_environment_variables(run_cli, tmp_path):
    out = tmp_path / "env.zarr"
    assert run_cli("ingest", "builtin:digits", out, env={"JEPA_INGEST_LIMIT": "3"}).exit_code == 0
    assert read(out / "inputs").shape[0] == 3


@pytest.mark.slow
def test_skip_bad_skips_corrupt_files_and_reports_how_many(run_cli, class_folder, tmp_path):
    (class_folder / "cat" / "broken.png").write_bytes(b"not a png")
    out = tmp_path / "pets.zarr"
    result = run_cli("ingest", class_folder, out, "--skip-bad", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["skipped"] == 1
    assert read(out / "inputs").shape[0] == 5 and read(out / "labels").tolist() == [0, 0, 0, 1, 1]


@pytest.mark.slow
def test_info_describes_a_dataset(run_cli, tmp_path):
    out = tmp_path / "digits.zarr"
    run_cli("ingest", "builtin:digits", out, "--limit", "20")
    info = json.loads(run_cli("info", out, "--json").stdout)
    assert info["kind"] == "dataset" and info["num_samples"] == 20
    assert info["inputs"]["shape"] == [20, 8, 8, 1] and info["inputs"]["dtype"] == "uint8"
    assert info["label_histogram"]["0"] == 2 and sum(info["label_histogram"].values()) == 20
    assert info["bytes_on_disk"] > 0
    human = run_cli("info", out)
    assert human.exit_code == 0 and "num_samples" in human.stdout


# --- bad input: exit 2, one line, nothing written ------------------------------------------------

def _latent_set(path: Path, shift: list) -> Path:
    from jepa_cli.data import store

    store.write_group(path, store.base_attributes("dataset", modality="latent", layout="ND", class_names=[],
                                                  latent_shift=shift, latent_scale=[2.0] * 64))
    store.write_array(path / "inputs", np.zeros((2, 64), np.float32))
    return path


@pytest.mark.slow
def test_info_summarises_a_latent_sets_per_channel_lists_in_one_line_each(run_cli, tmp_path):
    shift = [i / 64 for i in range(64)]
    r = run_cli("info", _latent_set(tmp_path / "lat.zarr", shift))
    assert r.exit_code == 0, r.stderr
    text = " ".join(r.stdout.split())  # the table wraps long cells
    assert '"latent_shift": "64 values, mean 0.492, range [0, 0.984]"' in text
    assert '"latent_scale": "64 values, mean 2, range [2, 2]"' in text
    assert len(r.stdout.splitlines()) < 20


@pytest.mark.slow
def test_info_json_keeps_every_value_of_a_latent_sets_lists(run_cli, tmp_path):
    shift = [i / 64 for i in range(64)]
    r = run_cli("info", _latent_set(tmp_path / "lat.zarr", shift), "--json")
    assert json.loads(r.stdout)["attributes"]["latent_shift"] == shift


def test_a_short_or_non_numeric_list_is_not_summarised_and_nan_is_counted():
    from jepa_cli.data.describe import numbers_summary

    assert numbers_summary([1.0] * 8) is None and numbers_summary(["a"] * 9) is None
    assert numbers_summary([1, 2, 3, None, 5, 6, 7, 8, 9]) == "9 values, mean 5.12, range [1, 9], 1 not finite"


def test_nan_and_infinity_inside_tuples_and_lists_become_null_in_a_description():
    from jepa_cli.data.jsonvalues import json_value

    value = {"a": (1.5, float("nan")), "b": [float("inf"), (float("-inf"), 2)], "c": "x"}
    assert json_value(value) == {"a": [1.5, None], "b": [None, [None, 2]], "c": "x"}
    json.dumps(json_value(value), allow_nan=False)  # valid JSON


@pytest.mark.slow
def test_missing_source_is_refused(run_cli, tmp_path):
    assert_user_error(run_cli("ingest", tmp_path / "nope", tmp_path / "o.zarr"), "nope", "no such file")
    assert nothing_written(tmp_path, "o.zarr")


@pytest.mark.slow
def test_unknown_builtin_is_refused(run_cli, tmp_path):
    assert_user_error(run_cli("ingest", "builtin:cifar", tmp_path / "o.zarr"), "builtin:cifar", "unknown")
    assert nothing_written(tmp_path, "o.zarr")


@pytest.mark.slow
def test_corrupt_image_is_refused_naming_the_file(run_cli, class_folder, tmp_path):
    (class_folder / "dog" / "zz.png").write_bytes(b"\x89PNG garbage")
    assert_user_error(run_cli("ingest", class_folder, tmp_path / "o.zarr"), "zz.png", "cannot decode")
    assert nothing_written(tmp_path, "o.zarr")


@pytest.mark.slow
def test_labels_of_the_wrong_length_are_refused(run_cli, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((4, 5, 5), np.uint8))
    np.save(tmp_path / "y.npy", np.zeros(3, np.int64))
    result = run_cli("ingest", tmp_path / "x.npy", tmp_path / "o.zarr", "--labels", tmp_path / "y.npy")
    assert_user_error(result, "y.npy", "3 labels for 4 samples")
    assert nothing_written(tmp_path, "o.zarr")


@pytest.mark.slow
def test_images_of_different_sizes_need_size(run_cli, tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    Image.new("L", (8, 8)).save(folder / "a.png")
    Image.new("L", (9, 8)).save(folder / "b.png")
    assert_user_error(run_cli("ingest", folder, tmp_path / "o.zarr"), "b.png", "--size")
    assert nothing_written(tmp_path, "o.zarr")


@pytest.mark.slow
def test_idx_with_a_wrong_magic_number_is_refused(run_cli, tmp_path):
    (tmp_path / "bad-idx3-ubyte").write_bytes(b"\x01\x02\x08\x03" + b"\x00" * 20)
    assert_user_error(run_cli("ingest", tmp_path / "bad-idx3-ubyte", tmp_path / "o.zarr"), "bad-idx3-ubyte", "magic")
    assert nothing_written(tmp_path, "o.zarr")


@pytest.mark.slow
def test_one_image_file_is_a_dataset_of_one_sample(run_cli, tmp_path):
    pixels = np.arange(6 * 4 * 3, dtype=np.uint8).reshape(6, 4, 3)
    Image.fromarray(pixels).save(tmp_path / "photo.png")
    result = run_cli("ingest", tmp_path / "photo.png", tmp_path / "one.zarr")
    assert result.exit_code == 0, result.stderr
    assert read(tmp_path / "one.zarr" / "inputs").tolist() == [pixels.tolist()]


@pytest.mark.slow
def test_a_file_of_no_known_kind_is_refused_saying_what_source_may_be(run_cli, tmp_path):
    (tmp_path / "notes.txt").write_text("hello world")
    assert_user_error(run_cli("ingest", tmp_path / "notes.txt", tmp_path / "o.zarr"), "notes.txt: not an IDX file",
                      "SOURCE may be a folder of images, an image file (", ".npy or .npz", "builtin:NAME")
    assert nothing_written(tmp_path, "o.zarr")


@pytest.mark.slow
def test_existing_output_is_not_overwritten_without_force(run_cli, tmp_path):
    out = tmp_path / "d.zarr"
    run_cli("ingest", "builtin:digits", out, "--limit", "4")
    before = read(out / "inputs")
    assert_user_error(run_cli("ingest", "builtin:digits", out, "--limit", "9"), "d.zarr", "--force")
    assert np.array_equal(read(out / "inputs"), before)
    assert run_cli("ingest", "builtin:digits", out, "--limit", "9", "--force").exit_code == 0
    assert read(out / "inputs").shape[0] == 9
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.zarr"]


@pytest.mark.slow
def test_bad_option_is_one_line_exit_2(run_cli, tmp_path):
    assert_user_error(run_cli("ingest", "builtin:digits", tmp_path / "o.zarr", "--channels", "2"), "--channels")
    assert_user_error(run_cli("ingest", "builtin:digits", tmp_path / "o.zarr", "--size", "ax3"), "--size")


def _ingest_process(tmp_path: Path, out: Path) -> subprocess.Popen:
    np.save(tmp_path / "big.npy", np.zeros((400_000, 8, 8), np.uint8))  # a minute of work: the signal always comes first
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # A shell without job control starts background jobs with SIGINT ignored, and children inherit
    # that; the child restores the handler a user's Ctrl-C would meet (no preexec_fn: JAX threads).
    code = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "sys.argv = ['jepa'] + sys.argv[1:]; runpy.run_module('jepa_cli', run_name='__main__')")
    return subprocess.Popen([sys.executable, "-c", code, "ingest", str(tmp_path / "big.npy"), str(out),
                             "--size", "64x64"], env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE)


def _wait_for_partial(tmp_path: Path, name: str, process: subprocess.Popen) -> None:
    deadline = time.time() + 60
    while not any(p.name.startswith(f".{name}.partial") for p in tmp_path.iterdir()):
        assert process.poll() is None and time.time() < deadline, "ingest never started writing"
        time.sleep(0.05)
    time.sleep(0.3)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_ingest_leaves_nothing_behind(tmp_path, sig):
    out = tmp_path / "big.zarr"
    process = _ingest_process(tmp_path, out)
    _wait_for_partial(tmp_path, "big.zarr", process)
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[sig], stderr
    assert stderr.decode().splitlines() == [
        {signal.SIGINT: "jepa: error: interrupted", signal.SIGTERM: "jepa: error: terminated (SIGTERM)"}[sig]]
    assert nothing_written(tmp_path, "big.zarr"), sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))


@pytest.mark.slow
def test_killed_ingest_leaves_no_output_directory(tmp_path):
    out = tmp_path / "big.zarr"
    process = _ingest_process(tmp_path, out)
    _wait_for_partial(tmp_path, "big.zarr", process)
    process.kill()
    process.wait(timeout=60)
    assert not out.exists()


# --- pixel values: every Pillow mode a folder can hold, scaled by its real range ---------------------

def saved(tmp_path: Path, image: Image.Image, suffix: str) -> Image.Image:
    """`image` written to and read back from a file, as a folder of images would hold it."""
    path = tmp_path / f"{image.mode.replace(';', '_')}{suffix}"
    image.save(path)
    reopened = Image.open(path)
    reopened.load()
    return reopened


def pixels(image: Image.Image, channels=None) -> list:
    from jepa_cli.data.pixels import to_pixels

    return to_pixels(image, channels, "x.png")[0, :, :].tolist()


@pytest.mark.slow
def test_one_bit_images_become_0_and_255(tmp_path):
    image = saved(tmp_path, Image.fromarray(np.array([[True, False]])), ".png")
    assert image.mode == "1" and pixels(image) == [[255], [0]]


@pytest.mark.slow
@pytest.mark.parametrize("mode, value, suffix", [("L", 77, ".png"), ("LA", (77, 9), ".png"), ("PA", (0, 9), ".tif")])
def test_gray_images_keep_their_8_bit_values(tmp_path, mode, value, suffix):
    image = Image.new(mode, (2, 1), value)
    if mode == "PA":
        image.putpalette([77, 77, 77] * 256)
    image = saved(tmp_path, image, suffix)
    assert image.mode == mode
    assert pixels(image, channels=1) == [[77], [77]]


@pytest.mark.slow
@pytest.mark.parametrize("mode, value, suffix, rgb", [
    ("RGB", (10, 20, 30), ".png", [10, 20, 30]),
    ("RGBA", (10, 20, 30, 0), ".png", [10, 20, 30]),  # alpha dropped, colour kept
    ("CMYK", (255, 0, 0, 0), ".tif", [0, 255, 255]),  # full cyan
    ("YCbCr", (128, 128, 128), ".tif", [128, 128, 128]),  # neutral gray
])
def test_colour_images_convert_to_rgb(tmp_path, mode, value, suffix, rgb):
    image = saved(tmp_path, Image.new(mode, (2, 1), value), suffix)
    assert image.mode == mode
    assert pixels(image) == [rgb, rgb]


@pytest.mark.slow
def test_palette_images_take_their_palette_colours(tmp_path):
    image = Image.new("P", (2, 1), 1)
    image.putpalette([0, 0, 0, 200, 100, 50] + [0] * 762)
    assert pixels(saved(tmp_path, image, ".png")) == [[200, 100, 50]] * 2


@pytest.mark.slow
@pytest.mark.parametrize("mode, suffix", [("I;16", ".png"), ("I;16B", ".tif"), ("I", ".tif")])
def test_16_bit_images_are_divided_by_257_not_saturated(tmp_path, mode, suffix):
    values = np.array([[0, 1000, 32896, 65535]], np.uint16)  # 1000 / 257 = 3.89, 32896 / 257 = 128
    image = Image.fromarray(values).convert("I") if mode == "I" else Image.fromarray(values)
    if mode == "I;16B":
        image = Image.frombytes("I;16B", (4, 1), values.astype(">u2").tobytes())
    image = saved(tmp_path, image, suffix)
    assert image.mode == mode
    assert pixels(image) == [[0], [4], [128], [255]]


@pytest.mark.slow
def test_float_images_in_0_1_are_scaled_by_255(tmp_path):
    image = saved(tmp_path, Image.fromarray(np.array([[0.0, 0.5, 1.0]], np.float32)), ".tif")
    assert image.mode == "F" and pixels(image) == [[0], [128], [255]]


@pytest.mark.parametrize("image, problem", [
    (Image.fromarray(np.array([[0.0, 1.5]], np.float32)), "float pixels must be finite and lie in \\[0, 1\\]"),
    (Image.fromarray(np.array([[0.0, np.nan]], np.float32)), "float pixels must be finite"),
    (Image.fromarray(np.array([[0, 70000]], np.int32)), "32-bit integer pixels outside \\[0, 65535\\]"),
    (Image.new("LAB", (2, 1)), "Pillow mode LAB is not supported"),
])
def test_pixels_without_a_known_range_are_refused_naming_the_file(image, problem):
    from jepa_cli.data.pixels import to_pixels
    from jepa_cli.data.samples import BadSample

    with pytest.raises(BadSample, match=f"^x.png: {problem}"):
        to_pixels(image, None, "x.png")


@pytest.mark.slow
@pytest.mark.parametrize("array, expected", [
    (np.array([[0, 257, 65535]], np.uint16), [0, 1, 255]),
    (np.array([[0, 0.5, 1]], np.float32), [0, 128, 255]),
    (np.array([[False, True, True]]), [0, 255, 255]),
    (np.array([[0, 7, 255]], np.int64), [0, 7, 255]),
])
def test_array_pixels_are_scaled_by_their_dtype(tmp_path, run_cli, array, expected):
    np.save(tmp_path / "x.npy", array[None])
    assert run_cli("ingest", tmp_path / "x.npy", tmp_path / "o.zarr").exit_code == 0
    assert read(tmp_path / "o.zarr" / "inputs").reshape(-1).tolist() == expected


@pytest.mark.slow
def test_a_folder_of_16_bit_and_float_images_keeps_their_brightness(run_cli, tmp_path):
    folder = tmp_path / "scans"
    folder.mkdir()
    Image.fromarray(np.full((2, 2), 51400, np.uint16)).save(folder / "a.png")  # 51400 / 257 = 200
    Image.fromarray(np.full((2, 2), 0.8, np.float32)).save(folder / "b.tif")  # 0.8 * 255 = 204
    assert run_cli("ingest", folder, tmp_path / "o.zarr").exit_code == 0
    assert read(tmp_path / "o.zarr" / "inputs")[:, 0, 0, 0].tolist() == [200, 204]


@pytest.mark.slow
def test_the_next_ingest_removes_the_partial_a_killed_ingest_left(run_cli, tmp_path):
    out = tmp_path / "big.zarr"
    process = _ingest_process(tmp_path, out)
    _wait_for_partial(tmp_path, "big.zarr", process)
    process.kill()  # SIGKILL: no cleanup runs, the kernel drops the partial's lock
    process.wait(timeout=60)
    [partial] = [p for p in tmp_path.iterdir() if p.name.startswith(".big.zarr.partial-")]
    result = run_cli("ingest", tmp_path / "big.npy", out, "--limit", "2")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines() == [f"removed {partial}, left by an interrupted write whose process is gone"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.npy", "big.zarr"]


@pytest.mark.slow
def test_a_running_ingests_partial_is_never_removed(run_cli, tmp_path):
    out = tmp_path / "big.zarr"
    process = _ingest_process(tmp_path, out)
    try:
        _wait_for_partial(tmp_path, "big.zarr", process)
        [partial] = [p for p in tmp_path.iterdir() if p.name.startswith(".big.zarr.partial-")]
        result = run_cli("ingest", tmp_path / "big.npy", out, "--limit", "2")  # a second writer of big.zarr
        assert result.exit_code == 0 and result.stderr == ""
        assert partial.is_dir() and process.poll() is None
    finally:
        process.kill()
        process.wait(timeout=60)


@pytest.mark.slow
def test_an_ingest_never_replaces_an_output_another_ingest_finished_meanwhile(run_cli, tmp_path, monkeypatch):
    from jepa_cli.data import store
    from jepa_cli.data.ingest import ingest
    from jepa_cli.data.sources import open_source

    np.save(tmp_path / "x.npy", np.zeros((3, 4, 4), np.uint8))
    out, write_group = tmp_path / "d.zarr", store.write_group

    def other_ingest_finishes_first(path, attributes):  # between the existence check and the move
        monkeypatch.setattr(store, "write_group", write_group)
        ingest(open_source(str(tmp_path / "x.npy")), out, limit=1)
        write_group(path, attributes)

    monkeypatch.setattr(store, "write_group", other_ingest_finishes_first)
    assert_user_error(run_cli("ingest", tmp_path / "x.npy", out), "d.zarr: already exists (another process wrote it")
    assert read(out / "inputs").shape[0] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.zarr", "x.npy"]


@pytest.mark.slow
def test_ingest_refuses_more_samples_than_the_disk_holds(run_cli, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from jepa_cli.data import resources

    monkeypatch.setattr(resources.shutil, "disk_usage", lambda path: SimpleNamespace(total=1 << 20, used=0, free=1 << 20))
    result = run_cli("ingest", "builtin:digits", tmp_path / "o.zarr", "--size", "32x32")  # 1797 x 1 KiB
    assert_user_error(result, "o.zarr: needs about 1.8 MiB of disk but 1.0 MiB is free",
                      "1797 samples of 32x32x1 bytes, uncompressed", "--limit")
    assert nothing_written(tmp_path, "o.zarr")


@pytest.mark.slow
def test_big_endian_16_bit_arrays_are_scaled_like_little_endian_ones(tmp_path, run_cli):
    np.save(tmp_path / "x.npy", np.array([[[0, 257, 65535]]], ">u2"))
    assert run_cli("ingest", tmp_path / "x.npy", tmp_path / "o.zarr").exit_code == 0
    assert read(tmp_path / "o.zarr" / "inputs").reshape(-1).tolist() == [0, 1, 255]


@pytest.mark.parametrize("mode", ["1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBX", "RGBa", "CMYK", "YCbCr", "HSV",
                                  "I;16", "I;16B", "I;16L", "I", "F"])
@pytest.mark.parametrize("channels", [1, 3])
def test_every_supported_mode_converts_to_the_requested_channels_and_size(mode, channels):
    """A 5x4 black-and-white checkerboard at each mode's full scale (255, 65535, 1.0) reads back as 0
    and 255 in every requested channel; resized to 3x2, it has that shape."""
    from jepa_cli.data.pixels import fit, to_pixels

    checker = np.indices((4, 5)).sum(0) % 2 * 255
    if mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        image = Image.new(mode, (5, 4))
        image.putdata((checker.ravel() // 255 * (1.0 if mode == "F" else 65535)).tolist())
    else:
        image = Image.fromarray(checker.astype(np.uint8)).convert("RGB").convert(mode)
    pixels = to_pixels(image, channels, "x.png")
    np.testing.assert_array_equal(pixels, np.repeat(checker[..., None], channels, axis=-1))
    assert fit(pixels, (3, 2)).shape == (3, 2, channels)


def test_builtin_digits_without_scikit_learn_names_the_extra(monkeypatch):
    import importlib.util

    from jepa_cli.data.digits import load_digit_images
    from jepa_cli.errors import InputError

    find_spec = importlib.util.find_spec  # what an install without the extra sees: no sklearn package
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sklearn" else find_spec(name, *a))
    with pytest.raises(InputError, match=r"builtin digits need scikit-learn: pip install 'jepa-cli\[digits\]'"):
        load_digit_images()


def test_builtin_digits_are_scikit_learns_digits_scaled_to_0_255():
    from sklearn.datasets import load_digits

    from jepa_cli.data.digits import load_digit_images

    images, labels, names = load_digit_images()
    reference = load_digits()
    assert images.shape == (1797, 8, 8) and images.dtype == np.uint8 and labels.dtype == np.int32
    np.testing.assert_array_equal(images, np.round(reference.images * (255.0 / 16.0)).astype(np.uint8))
    np.testing.assert_array_equal(labels, reference.target)
    assert names == [str(c) for c in range(10)] and int(images.max()) == 255
