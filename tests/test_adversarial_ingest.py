"""Hostile-user cases for dataset writes (`jepa ingest`, `jepa mask -o`) and dataset reads:
each refusal is one `jepa: error:` line, exit 2, and leaves every guarded path byte-identical."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from adversarial import expect_refusal, jepa_env, run_jepa
from conftest import assert_user_error
from jepa_cli.data import resources, store

pytestmark = pytest.mark.slow


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """A folder of two 4x4 gray images."""
    root = tmp_path / "src"
    root.mkdir()
    for i in range(2):
        Image.new("L", (4, 4), 40 * i).save(root / f"{i}.png")
    return root


def dataset(path: Path) -> Path:
    """A minimal dataset directory (what --force may replace)."""
    store.write_group(path, store.base_attributes("dataset"))
    return path


# --- data loss: an output never is, contains or lies inside an input ---------------------------------

def test_ingest_onto_its_own_source_with_force_is_refused(tmp_path, src):
    expect_refusal("ingest", src, src, "--force", guard=[tmp_path], fragments=[f"{src}: the output is the input"])


def test_ingest_into_its_own_source_is_refused(tmp_path, src):
    expect_refusal("ingest", src, src / "out.zarr", guard=[tmp_path], fragments=["lies inside the input", str(src)])


def test_ingest_onto_a_folder_that_contains_its_source_is_refused(tmp_path, src):
    expect_refusal("ingest", src, tmp_path, "--force", guard=[tmp_path], fragments=["contains the input", str(src)])


def test_ingest_through_a_symlink_into_its_source_is_refused(tmp_path, src):
    (tmp_path / "alias").symlink_to(src)
    expect_refusal("ingest", src, tmp_path / "alias" / "out.zarr", guard=[tmp_path],
                   fragments=["lies inside the input"])


def test_ingest_onto_a_dataset_holding_its_labels_file_is_refused(tmp_path):
    old = dataset(tmp_path / "old.zarr")
    np.save(old / "labels.npy", np.array([0, 1]))
    np.save(tmp_path / "x.npy", np.zeros((2, 4, 4), np.uint8))
    expect_refusal("ingest", tmp_path / "x.npy", old, "--labels", old / "labels.npy", "--force", guard=[tmp_path],
                   fragments=["contains the input", "labels.npy"])


def test_encode_latents_onto_its_own_dataset_is_refused(tmp_path):
    data = dataset(tmp_path / "d.zarr")
    (tmp_path / "run").mkdir()
    expect_refusal("encode-latents", tmp_path / "run", data, "-o", data, "--force", guard=[tmp_path],
                   fragments=[f"{data}: the output is the input"])


# --- data loss: --force replaces only an artifact of the same kind -------------------------------------

def test_ingest_force_refuses_a_users_folder(tmp_path, src):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "holiday.jpg").write_bytes(b"irreplaceable")
    expect_refusal("ingest", src, tmp_path / "photos", "--force", guard=[tmp_path],
                   fragments=[f"{tmp_path / 'photos'}: is not a jepa output", "jepa_kind 'dataset'"])


def test_ingest_force_refuses_a_training_run(tmp_path, src):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"jepa_kind": "run"}))
    expect_refusal("ingest", src, run, "--force", guard=[tmp_path], fragments=[str(run), "not a jepa output"])


def test_ingest_force_refuses_a_mask_file(tmp_path, src):
    store.write_group(tmp_path / "m.zarr", store.base_attributes("masks"))
    expect_refusal("ingest", src, tmp_path / "m.zarr", "--force", guard=[tmp_path],
                   fragments=["m.zarr: holds jepa_kind 'masks'"])


def test_mask_force_refuses_a_dataset(tmp_path):
    data = dataset(tmp_path / "d.zarr")
    expect_refusal("mask", "--strategy", "random", "--grid", "4x4", "--batch-size", "2", "-o", data, "--force",
                   guard=[tmp_path], fragments=["d.zarr: holds jepa_kind 'dataset'", "jepa_kind 'masks'"])


def test_mask_output_inside_the_dataset_it_draws_is_refused(tmp_path):
    data = dataset(tmp_path / "d.zarr")
    expect_refusal("mask", "--strategy", "random", "--grid", "4x4", "--batch-size", "2", "-o", data / "m.zarr",
                   "--png", tmp_path / "p.png", "--data", data, guard=[tmp_path], fragments=["lies inside the input"])


def test_of_two_concurrent_ingests_to_one_new_output_exactly_one_succeeds(tmp_path, src):
    runs = [subprocess.Popen([sys.executable, "-m", "jepa_cli", "ingest", str(src), str(tmp_path / "o.zarr"),
                              "--limit", str(limit)], env=jepa_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for limit in (1, 2)]
    results = [(run.wait(timeout=120), run.stderr.read().decode()) for run in runs]
    assert sorted(code for code, _ in results) == [0, 2], results
    winner = [1, 2][[code for code, _ in results].index(0)]
    assert "o.zarr: already exists" in [err for code, err in results if code == 2][0]
    assert store.read_array(tmp_path / "o.zarr" / "inputs").shape[0] == winner
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.zarr", "src"]


# --- stale partials ------------------------------------------------------------------------------------

def test_a_stale_partial_is_removed_by_the_next_ingest_which_says_so(tmp_path, src):
    stale = tmp_path / ".out.zarr.partial-0123abcd"
    stale.mkdir()
    (stale / "inputs").write_bytes(b"\0" * 1000)
    result = run_jepa("ingest", src, tmp_path / "out.zarr")
    assert result.returncode == 0, result.stderr
    assert f"removed {stale}, left by an interrupted write" in " ".join(result.stderr.decode().split())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.zarr", "src"]


# --- resources and inconsistent inputs -------------------------------------------------------------------

def test_a_size_that_cannot_fit_in_memory_is_refused_before_writing(tmp_path, src):
    # one 10^6 x 10^6 gray sample is 0.9 TiB; writing one needs about 14 of them in memory
    expect_refusal("ingest", src, tmp_path / "huge.zarr", "--size", "1000000x1000000", guard=[tmp_path],
                   fragments=["huge.zarr: needs about 12.7 TiB of memory but", "pass a --size smaller than"])


def test_size_with_mixed_channel_counts_names_channels(tmp_path, src):
    Image.new("RGB", (4, 4)).save(src / "2.png")
    expect_refusal("ingest", src, tmp_path / "o.zarr", "--size", "4x4", guard=[tmp_path],
                   fragments=["2.png: 3 channel(s) but the first sample has 1", "--channels"])


def test_a_float_tiff_outside_0_1_is_refused_naming_the_file(tmp_path, src):
    Image.fromarray(np.full((4, 4), 3.5, np.float32)).save(src / "2.tif")
    expect_refusal("ingest", src, tmp_path / "o.zarr", guard=[tmp_path],
                   fragments=["2.tif: float pixels must be finite and lie in [0, 1]"])


# --- broken array files (in-process: nothing but a file read runs) ----------------------------------------

def _object_npy(path: Path) -> None:
    np.save(path, np.array([None, 1], dtype=object), allow_pickle=True)


def _truncated_npy(path: Path) -> None:
    np.save(path, np.zeros((4, 8, 8), np.uint8))
    path.write_bytes(path.read_bytes()[:100])


@pytest.mark.parametrize("make, problem", [
    (_object_npy, "not a readable .npy file"),
    (_truncated_npy, "not a readable .npy file"),
    (lambda path: path.write_bytes(b"garbage" * 20), "not a readable .npy file"),
])
def test_a_broken_npy_is_refused_naming_the_file(run_cli, tmp_path, make, problem):
    make(tmp_path / "x.npy")
    assert_user_error(run_cli("ingest", tmp_path / "x.npy", tmp_path / "o.zarr"), f"{tmp_path / 'x.npy'}: {problem}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npy"]


def test_an_npz_with_a_truncated_member_is_refused_naming_file_and_key(run_cli, tmp_path):
    np.savez_compressed(tmp_path / "x.npz", images=np.random.default_rng(0).integers(0, 255, (50, 8, 8), np.uint8))
    raw = (tmp_path / "x.npz").read_bytes()
    (tmp_path / "x.npz").write_bytes(raw[:200] + b"\0" * 300 + raw[500:])  # damage the deflate stream
    assert_user_error(run_cli("ingest", tmp_path / "x.npz", tmp_path / "o.zarr"), "x.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npz"]


def test_an_npy_holding_objects_as_labels_is_refused(run_cli, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((2, 4, 4), np.uint8))
    _object_npy(tmp_path / "y.npy")
    assert_user_error(run_cli("ingest", tmp_path / "x.npy", tmp_path / "o.zarr", "--labels", tmp_path / "y.npy"),
                      "y.npy: not a readable .npy file")


# --- reading damaged datasets ---------------------------------------------------------------------------

def test_info_on_a_dataset_with_a_corrupt_zarr_json_names_it(tmp_path, src):
    assert run_jepa("ingest", src, tmp_path / "d.zarr").returncode == 0
    (tmp_path / "d.zarr" / "zarr.json").write_text('{"zarr_format": 3, "node_')
    expect_refusal("info", tmp_path / "d.zarr", guard=[tmp_path],
                   fragments=[f"{tmp_path / 'd.zarr' / 'zarr.json'}: corrupt zarr metadata", "--force"])


def test_info_on_a_dataset_with_a_truncated_chunk_names_array_and_chunk(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((3, 4, 4), np.uint8))
    np.save(tmp_path / "y.npy", np.array([0, 1, 2]))
    assert run_jepa("ingest", tmp_path / "x.npy", tmp_path / "d.zarr", "--labels", tmp_path / "y.npy").returncode == 0
    chunk = tmp_path / "d.zarr" / "labels" / "c" / "0"
    chunk.write_bytes(chunk.read_bytes()[:4])
    expect_refusal("info", tmp_path / "d.zarr", guard=[tmp_path],
                   fragments=[f"{tmp_path / 'd.zarr' / 'labels'}: chunk c/0 is damaged"])


# --- file names that are not UTF-8 ---------------------------------------------------------------------------

def test_non_utf8_file_names_reach_attributes_and_json_as_escaped_utf8(tmp_path):
    root = os.fsencode(tmp_path / "src")
    os.makedirs(root + b"/caf\xe9")
    Image.new("L", (4, 4)).save(root + b"/caf\xe9/\xff.png")
    (Path(os.fsdecode(root)) / os.fsdecode(b"caf\xe9") / os.fsdecode(b"bad\xfe.png")).write_bytes(b"junk")
    result = run_jepa("ingest", tmp_path / "src", tmp_path / "o.zarr", "--skip-bad", "--json")
    assert result.returncode == 0, result.stderr
    json.loads(result.stdout.decode("utf-8"))
    attrs = json.loads((tmp_path / "o.zarr" / "zarr.json").read_bytes().decode("utf-8"))["attributes"]
    assert attrs["class_names"] == ["caf\\xe9"]
    assert attrs["skipped"] == [f"{tmp_path}/src/caf\\xe9/bad\\xfe.png"]


def test_an_output_path_that_is_not_utf8_is_refused(tmp_path, src):
    expect_refusal("ingest", src, os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9.zarr"), guard=[tmp_path],
                   fragments=["caf\\xe9.zarr: the path is not valid UTF-8"])



# --- folders: links, unreadable folders, two kinds of files ------------------------------------------------

def _wav_classes(root: Path, classes=("a", "b"), per_class: int = 2) -> Path:
    """root/<class>/<i>.wav: 0.1 s of silence at 8 kHz each."""
    import soundfile as sf

    for name in classes:
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            sf.write(root / name / f"{i}.wav", np.zeros(800, np.float32), 8000)
    return root


def test_an_audio_class_folder_that_is_a_link_is_followed(run_cli, tmp_path):
    root = _wav_classes(tmp_path / "sounds", classes=("a",))
    _wav_classes(tmp_path / "elsewhere", classes=("b",), per_class=3)
    (root / "b").symlink_to(tmp_path / "elsewhere" / "b")
    result = run_cli("ingest", root, tmp_path / "o.zarr", "--sample-rate", "8000", "--seconds", "0.1", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["label_histogram"] == [2, 3]


def test_a_link_to_a_folder_that_holds_it_is_refused_naming_the_link(run_cli, tmp_path):
    root = _wav_classes(tmp_path / "sounds")
    (root / "a" / "again").symlink_to(root)
    assert_user_error(run_cli("ingest", root, tmp_path / "o.zarr"), f"{root / 'a' / 'again'}: is a link to a folder "
                      "that holds it (a loop)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sounds"]


@pytest.mark.parametrize("kind", ["audio", "image"])
def test_a_folder_that_cannot_be_listed_is_refused_naming_it(run_cli, tmp_path, monkeypatch, kind):
    if kind == "audio":
        root = _wav_classes(tmp_path / "src")
    else:
        root = tmp_path / "src"
        for name in ("a", "b"):
            (root / name).mkdir(parents=True)
            Image.new("L", (4, 4)).save(root / name / "0.png")
    locked, scandir = root / "b", os.scandir

    def refuse_locked(path="."):  # a folder without read permission (chmod has no effect on root)
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refuse_locked)
    assert_user_error(run_cli("ingest", root, tmp_path / "o.zarr"), f"{locked}: cannot list this folder "
                      "(Permission denied)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_a_folder_of_audio_with_a_cover_image_per_class_is_refused_naming_one_of_each(run_cli, tmp_path):
    root = _wav_classes(tmp_path / "sounds", per_class=4)
    for name in ("a", "b"):
        Image.new("L", (4, 4)).save(root / name / "cover.png")
    assert_user_error(run_cli("ingest", root, tmp_path / "o.zarr"),
                      f"{root}: holds both audio files ({root / 'a' / '0.wav'}) and image files "
                      f"({root / 'a' / 'cover.png'})")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sounds"]


# --- video requests too big to fit: refused from the sizes given, before a frame is decoded -----------------

def _frame_folder(root: Path, frames: int = 3) -> Path:
    """root/walk/clip/frame<j>.png: `frames` gray 6x8 (HxW) frames of value 10 j."""
    (root / "walk" / "clip").mkdir(parents=True)
    for j in range(frames):
        Image.fromarray(np.full((6, 8), 10 * j, np.uint8)).save(root / "walk" / "clip" / f"frame{j}.png")
    return root


def test_a_clip_too_big_for_memory_is_refused_before_any_frame_is_decoded(run_cli, tmp_path, monkeypatch):
    from jepa_cli.data import video

    root = _frame_folder(tmp_path / "clips")
    decoded = []
    monkeypatch.setattr(video.ClipCodec, "pixels", staticmethod(lambda *args: decoded.append(args)))
    monkeypatch.setattr(resources, "available_memory", lambda: 16 << 20)  # 3 MiB a clip: 8 chunks + 6 clips + indices
    result = run_cli("ingest", root, tmp_path / "o.zarr", "--frames", "65536")
    assert_user_error(result, f"{tmp_path / 'o.zarr'}: needs about 43.5 MiB of memory but 16.0 MiB is available",
                      "one sample is 65536x6x8x1 bytes; pass fewer --frames")
    assert decoded == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clips"]


def test_more_frames_per_clip_than_the_limit_are_refused(run_cli, tmp_path):
    root = _frame_folder(tmp_path / "clips")
    assert_user_error(run_cli("ingest", root, tmp_path / "o.zarr", "--frames", "2000000000"),
                      "--frames 2000000000: the limit is 65536 frames per clip")


def test_more_clips_per_video_than_memory_holds_are_refused_naming_the_count(run_cli, tmp_path, monkeypatch):
    root = _frame_folder(tmp_path / "clips")
    monkeypatch.setattr(resources, "available_memory", lambda: 100 << 20)
    assert_user_error(run_cli("ingest", root, tmp_path / "o.zarr", "--clips-per-video", "10000000"),
                      f"{root}: needs about 267.0 MiB of memory but 100.0 MiB is available; 1 video(s) x "
                      "--clips-per-video 10000000 = 10000000 clips")


def test_a_frame_stride_longer_than_the_video_gives_its_first_frame_then_its_last(run_cli, tmp_path):
    root = _frame_folder(tmp_path / "clips")
    result = run_cli("ingest", root, tmp_path / "o.zarr", "--frames", "3", "--frame-stride", str(2**63 - 1), "--json")
    assert result.exit_code == 0, result.stderr
    clip = store.read_array(tmp_path / "o.zarr" / "inputs")[0]
    assert clip[:, 0, 0, 0].tolist() == [0, 20, 20]
    assert store.read_attributes(tmp_path / "o.zarr")["padded"] == [str(root / "walk" / "clip")]


def test_clip_options_on_builtin_moving_digits_are_refused(run_cli, tmp_path):
    assert_user_error(run_cli("ingest", "builtin:moving-digits", tmp_path / "o.zarr", "--frames", "4"),
                      "builtin:moving-digits: --frames, --frame-stride and --clips-per-video do not apply to it")


# --- audio files whose header asks for more memory than there is -------------------------------------------

def test_a_wav_whose_header_says_1_hz_is_refused_before_resampling_with_the_figure(run_cli, tmp_path, monkeypatch):
    import struct

    import soundfile as sf

    (tmp_path / "src" / "c").mkdir(parents=True)
    wav = tmp_path / "src" / "c" / "x.wav"
    sf.write(wav, np.zeros(2000, np.int16), 8000, subtype="PCM_16")
    header = bytearray(wav.read_bytes())
    header[24:32] = struct.pack("<II", 1, 2)  # sample rate 1 Hz, 2 bytes a second
    wav.write_bytes(bytes(header))
    monkeypatch.setattr(resources, "available_memory", lambda: 16 << 20)
    result = run_cli("ingest", tmp_path / "src", tmp_path / "o.zarr", "--seconds", "0.1")
    assert_user_error(result, f"{wav}: needs about 488.3 MiB of memory to decode (2000 samples x 1 channel(s) at 1 Hz, "
                      "resampled to 32000 Hz) but 16.0 MiB is available")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_hidden_macos_companion_files_in_an_image_folder_are_skipped(run_cli, tmp_path):
    (tmp_path / "src" / "c").mkdir(parents=True)
    Image.new("L", (4, 4), 9).save(tmp_path / "src" / "c" / "x.png")
    (tmp_path / "src" / "c" / "._x.png").write_bytes(b"\0\5\x16\7" * 10)  # AppleDouble metadata, not a PNG
    result = run_cli("ingest", tmp_path / "src", tmp_path / "o.zarr", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["shape"] == [1, 4, 4, 1]


def test_images_beside_the_frame_folders_of_a_video_source_are_refused_naming_one(run_cli, tmp_path):
    root = _frame_folder(tmp_path / "clips")
    (root / "run").mkdir()
    Image.new("L", (8, 6)).save(root / "run" / "still.png")  # a class of loose images: no clip
    assert_user_error(run_cli("ingest", root, tmp_path / "o.zarr"),
                      f"{root / 'run' / 'still.png'}: an image file where a video source has video files or folders "
                      "of frames")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clips"]


def test_a_later_video_too_big_for_memory_is_refused_naming_it_before_its_frames_are_decoded(run_cli, tmp_path,
                                                                                            monkeypatch):
    root = _frame_folder(tmp_path / "clips")  # walk/clip: 6x8 frames
    (root / "walk" / "zoom").mkdir()
    for j in range(3):
        Image.new("L", (800, 600), j).save(root / "walk" / "zoom" / f"frame{j}.png")
    monkeypatch.setattr(resources, "available_memory", lambda: 100 << 20)  # a 64-frame clip of 600x800 is 29.3 MiB
    result = run_cli("ingest", root, tmp_path / "o.zarr", "--frames", "64", "--size", "6x8")
    assert_user_error(result, f"{root / 'walk' / 'zoom'}: needs about 175.8 MiB of memory but 100.0 MiB is available; "
                      "one clip is 64x600x800x1 bytes at its own size")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clips"]


def test_an_idx_whose_header_announces_more_than_memory_holds_is_refused_before_reading(run_cli, tmp_path, monkeypatch):
    import gzip
    import struct

    with gzip.open(tmp_path / "bomb-idx3-ubyte.gz", "wb") as handle:  # a few bytes that claim 2 GB of pixels
        handle.write(struct.pack(">HBBIII", 0, 8, 3, 200000, 100, 100) + b"\0" * 1000)
    monkeypatch.setattr(resources, "available_memory", lambda: 100 << 20)
    assert_user_error(run_cli("ingest", tmp_path / "bomb-idx3-ubyte.gz", tmp_path / "o.zarr"),
                      f"{tmp_path / 'bomb-idx3-ubyte.gz'}: needs about 3.7 GiB of memory but 100.0 MiB is available; "
                      "its header says [200000, 100, 100]")


def test_an_npz_array_larger_than_memory_is_refused_before_it_is_decompressed(run_cli, tmp_path, monkeypatch):
    np.savez_compressed(tmp_path / "x.npz", images=np.zeros((1000, 64, 64), np.uint8))  # 3.9 MiB, a few KiB packed
    monkeypatch.setattr(resources, "available_memory", lambda: 1 << 20)
    assert_user_error(run_cli("ingest", tmp_path / "x.npz", tmp_path / "o.zarr"),
                      f"{tmp_path / 'x.npz'}[images]: needs about 3.9 MiB of memory but 1.0 MiB is available; "
                      "a .npz array is decompressed whole")


@pytest.mark.parametrize("args, fragment", [
    (("--limit", "0"), "'--limit': 0 is not in the range x>=1"),
    (("--test-fraction", "1", "--split", "train"), "'--test-fraction': 1.0 is not in the range 0.0<x<1.0"),
    (("--test-fraction", "0", "--split", "train"), "'--test-fraction': 0.0 is not in the range 0.0<x<1.0"),
])
def test_ingest_limit_and_test_fraction_out_of_range_are_refused_by_their_option(tmp_path, run_cli, args, fragment):
    assert_user_error(run_cli("ingest", "builtin:digits", tmp_path / "d.zarr", *args), fragment)
    assert list(tmp_path.iterdir()) == []
