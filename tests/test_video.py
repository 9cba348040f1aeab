"""Video ingest: builtin:moving-digits, [N, T, H, W, C] arrays, folders of frames, video files (PyAV)."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import assert_user_error, nothing_written
from conftest import read_zarr as read
from conftest import zarr_attributes as attributes


def centroid(frame: np.ndarray) -> np.ndarray:
    """(row, column) centre of mass of a [H, W, 1] frame."""
    weights = frame[..., 0].astype(np.float64)
    rows, cols = np.indices(weights.shape)
    return np.array([(rows * weights).sum(), (cols * weights).sum()]) / weights.sum()


# -- builtin:moving-digits ---------------------------------------------------------------------
@pytest.mark.slow
def test_moving_digits_are_16_frames_of_32x32_labelled_by_digit(run_cli, tmp_path):
    from sklearn.datasets import load_digits

    out = tmp_path / "md.zarr"
    result = run_cli("ingest", "builtin:moving-digits", out, "--limit", "6", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["shape"] == [6, 16, 32, 32, 1]
    clips = read(out / "inputs")
    assert read(out / "labels").tolist() == load_digits().target[:6].tolist()
    attrs = attributes(out)
    assert (attrs["modality"], attrs["layout"], attrs["frames"], attrs["frame_stride"]) == ("video", "NTHWC", 16, 1)
    assert attrs["class_names"] == [str(d) for d in range(10)]
    # the digit moves: every frame holds the whole 16x16 glyph (the same ink), at another place
    ink = clips[0].reshape(16, -1).sum(axis=1)
    assert np.all(ink == ink[0]) and ink[0] > 0
    assert not np.array_equal(clips[0, 0], clips[0, 1])


@pytest.mark.slow
def test_moving_digits_are_the_same_on_every_ingest(run_cli, tmp_path):
    for name in ("a.zarr", "b.zarr"):
        assert run_cli("ingest", "builtin:moving-digits", tmp_path / name, "--limit", "3", "-q").exit_code == 0
    assert np.array_equal(read(tmp_path / "a.zarr" / "inputs"), read(tmp_path / "b.zarr" / "inputs"))


@pytest.mark.slow
def test_moving_digits_direction_label_is_the_first_step_of_the_motion(run_cli, tmp_path):
    out = tmp_path / "dir.zarr"
    assert run_cli("ingest", "builtin:moving-digits?label=direction", out, "--limit", "40", "-q").exit_code == 0
    assert attributes(out)["class_names"] == ["up-left", "up-right", "down-left", "down-right"]
    clips, labels = read(out / "inputs"), read(out / "labels")
    assert sorted(set(labels.tolist())) == [0, 1, 2, 3]
    for clip, label in zip(clips, labels):
        dy, dx = centroid(clip[1]) - centroid(clip[0])
        assert (int(dy > 0), int(dx > 0)) == (label // 2, label % 2)


@pytest.mark.slow
def test_moving_digits_options_two_digits_and_64x64(run_cli, tmp_path):
    out = tmp_path / "two.zarr"
    result = run_cli("ingest", "builtin:moving-digits?digits=2&size=64", out, "--limit", "2", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["shape"] == [2, 16, 64, 64, 1]
    one = tmp_path / "one.zarr"
    assert run_cli("ingest", "builtin:moving-digits?size=64", one, "--limit", "2", "-q").exit_code == 0
    assert read(out / "inputs")[0, 0].sum() > read(one / "inputs")[0, 0].sum()  # a second glyph's ink


@pytest.mark.slow
def test_moving_digits_unknown_option_is_one_line(run_cli, tmp_path):
    assert_user_error(run_cli("ingest", "builtin:moving-digits?speed=3", tmp_path / "x.zarr"), "speed")
    assert_user_error(run_cli("ingest", "builtin:moving-digits?label=colour", tmp_path / "x.zarr"),
                      "label must be digit or direction")
    assert nothing_written(tmp_path, "x.zarr")


def test_list_builtins_names_moving_digits(run_cli):
    result = run_cli("ingest", "--list-builtins")
    assert "builtin:moving-digits\tvideo:" in result.stdout


# -- arrays [N, T, H, W, C] ------------------------------------------------------------------
def numbered_clips(n: int, t: int) -> np.ndarray:
    """uint8 [n, t, 4, 4, 1] whose frame j of clip i is filled with 10 * i + j."""
    values = 10 * np.arange(n)[:, None] + np.arange(t)[None, :]
    return np.broadcast_to(values[:, :, None, None, None], (n, t, 4, 4, 1)).astype(np.uint8).copy()


@pytest.mark.slow
def test_npy_clips_keep_their_frames_by_default(run_cli, tmp_path):
    np.save(tmp_path / "c.npy", numbered_clips(3, 5))
    out = tmp_path / "c.zarr"
    result = run_cli("ingest", tmp_path / "c.npy", out, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["shape"] == [3, 5, 4, 4, 1]
    assert read(out / "inputs")[2, :, 0, 0, 0].tolist() == [20, 21, 22, 23, 24]
    assert (attributes(out)["frames"], attributes(out)["frame_stride"]) == (5, 1)


@pytest.mark.slow
def test_frames_stride_and_evenly_spaced_clips_per_video(run_cli, tmp_path):
    np.savez(tmp_path / "c.npz", inputs=numbered_clips(2, 12), labels=np.array([1, 0]))
    out = tmp_path / "c.zarr"
    result = run_cli("ingest", tmp_path / "c.npz", out, "--frames", "3", "--frame-stride", "2",
                     "--clips-per-video", "3", "--json")
    assert result.exit_code == 0, result.stderr
    frames = read(out / "inputs")[:, :, 0, 0, 0].tolist()
    # span (3 - 1) x 2 + 1 = 5 frames; starts evenly spaced over 0..12-5: 0, 4 (3.5 rounded to even), 7
    assert frames[:3] == [[0, 2, 4], [4, 6, 8], [7, 9, 11]]
    assert frames[3] == [10, 12, 14]
    assert read(out / "labels").tolist() == [1, 1, 1, 0, 0, 0]
    assert attributes(out)["clips_per_video"] == 3


@pytest.mark.slow
def test_short_clip_is_padded_with_its_last_frame_or_skipped_with_skip_bad(run_cli, tmp_path):
    np.save(tmp_path / "c.npy", numbered_clips(2, 4))
    out = tmp_path / "pad.zarr"
    result = run_cli("ingest", tmp_path / "c.npy", out, "--frames", "3", "--frame-stride", "2", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["padded"] == 2
    assert read(out / "inputs")[1, :, 0, 0, 0].tolist() == [10, 12, 13]  # frame 4 does not exist: 3 again
    assert attributes(out)["padded"] == [f"{tmp_path / 'c.npy'}[0]", f"{tmp_path / 'c.npy'}[1]"]
    skipped = run_cli("ingest", tmp_path / "c.npy", tmp_path / "skip.zarr", "--frames", "3", "--frame-stride", "2",
                      "--skip-bad")
    assert_user_error(skipped, f"--skip-bad skipped every sample, the first because {tmp_path / 'c.npy'}[0]: 4 frame(s), "
                      "shorter than one clip of 3 frames every 2 (5 frames)")
    assert nothing_written(tmp_path, "skip.zarr")


@pytest.mark.slow
def test_zero_frames_and_frames_zero_are_one_line(run_cli, tmp_path):
    np.save(tmp_path / "empty.npy", np.zeros((2, 0, 4, 4, 1), np.uint8))
    assert_user_error(run_cli("ingest", tmp_path / "empty.npy", tmp_path / "e.zarr"), "empty.npy", "zero frames")
    np.save(tmp_path / "c.npy", numbered_clips(1, 4))
    assert_user_error(run_cli("ingest", tmp_path / "c.npy", tmp_path / "e.zarr", "--frames", "0"), "--frames")
    assert nothing_written(tmp_path, "e.zarr")


@pytest.mark.slow
def test_clip_options_on_an_image_source_are_refused(run_cli, tmp_path):
    np.save(tmp_path / "img.npy", np.zeros((2, 4, 4), np.uint8))
    assert_user_error(run_cli("ingest", tmp_path / "img.npy", tmp_path / "i.zarr", "--frames", "4"),
                      "apply to video sources only")
    assert nothing_written(tmp_path, "i.zarr")


# -- folders of frames -------------------------------------------------------------------------
def write_frames(folder: Path, values, size=(6, 8)) -> None:
    folder.mkdir(parents=True)
    for j, v in enumerate(values):
        Image.fromarray(np.full(size, v, np.uint8)).save(folder / f"frame{j}.png")


@pytest.mark.slow
def test_frame_folders_under_class_folders_in_natural_order(run_cli, tmp_path):
    root = tmp_path / "clips"
    write_frames(root / "jump" / "a", range(0, 120, 10))  # frame2 before frame10
    write_frames(root / "jump" / "b", range(100, 220, 10))
    write_frames(root / "walk" / "c", range(50, 170, 10))
    out = tmp_path / "f.zarr"
    result = run_cli("ingest", root, out, "--frames", "4", "--frame-stride", "3", "--size", "4x4", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["shape"] == [3, 4, 4, 4, 1]
    assert read(out / "inputs")[0, :, 0, 0, 0].tolist() == [0, 30, 60, 90]
    assert read(out / "labels").tolist() == [0, 0, 1]
    assert attributes(out)["class_names"] == ["jump", "walk"]


@pytest.mark.slow
def test_frame_folders_default_to_16_frames_every_4(run_cli, tmp_path):
    root = tmp_path / "clips"
    write_frames(root / "c" / "x", range(61))
    out = tmp_path / "f.zarr"
    result = run_cli("ingest", root, out, "--json")
    assert result.exit_code == 0, result.stderr
    assert read(out / "inputs")[0, :, 0, 0, 0].tolist() == list(range(0, 61, 4))
    assert (attributes(out)["frames"], attributes(out)["frame_stride"], attributes(out)["padded"]) == (16, 4, [])


@pytest.mark.slow
def test_mismatched_frame_sizes_in_one_clip_folder_are_one_line(run_cli, tmp_path):
    root = tmp_path / "clips"
    write_frames(root / "c" / "bad", range(3))
    Image.fromarray(np.zeros((5, 5), np.uint8)).save(root / "c" / "bad" / "frame3.png")
    result = run_cli("ingest", root, tmp_path / "f.zarr", "--frames", "4", "--frame-stride", "1")
    assert_user_error(result, str(root / "c" / "bad"), "frame3.png is 5x5", "frame0.png is 6x8")  # HxW, as --size
    assert nothing_written(tmp_path, "f.zarr")


def test_a_clip_whose_frames_differ_in_size_names_both_sizes_as_hxw():
    from jepa_cli.data.samples import BadSample
    from jepa_cli.data.video import ClipCodec

    with pytest.raises(BadSample, match="x: frame 1 is 4x10 but frame 0 is 6x8"):
        ClipCodec.pixels([np.zeros((6, 8), np.uint8), np.zeros((4, 10), np.uint8)], None, "x")


# -- video files -------------------------------------------------------------------------------
def write_video(path: Path, values, fps: int = 10) -> None:
    """A tiny MPEG-4 file whose frame j is a flat gray of values[j]."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = 16, 16, "yuv420p"
        for v in values:
            frame = av.VideoFrame.from_ndarray(np.full((16, 16, 3), v, np.uint8), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())


@pytest.fixture(scope="module")
def video_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("videos")
    for name, start in (("cats", 0), ("dogs", 40)):
        (root / name).mkdir()
        write_video(root / name / "v.mp4", range(start, start + 200, 10))  # 20 frames
    (root / "dogs" / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 not a video at all")
    return root


@pytest.mark.slow
def test_video_files_are_decoded_clipped_and_labelled(run_cli, video_folder, tmp_path):
    out = tmp_path / "v.zarr"
    result = run_cli("ingest", video_folder, out, "--frames", "4", "--frame-stride", "5", "--clips-per-video", "2",
                     "--skip-bad", "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["shape"] == [4, 4, 16, 16, 3] and summary["skipped"] == 2  # broken.mp4's two clips
    gray = read(out / "inputs")[:, :, 8, 8].mean(axis=-1)
    # clip starts 0 and 20 - 16 = 4; frames 0, 5, 10, 15 and 4, 9, 14, 19 (lossy codec: within 6)
    np.testing.assert_allclose(gray[0], [0, 50, 100, 150], atol=6)
    np.testing.assert_allclose(gray[3], [80, 130, 180, 230], atol=6)
    assert read(out / "labels").tolist() == [0, 0, 1, 1]
    attrs = attributes(out)
    assert (attrs["fps"], attrs["frames"], attrs["frame_stride"]) == (10.0, 4, 5)
    assert attrs["skipped"] == [f"{video_folder / 'dogs' / 'broken.mp4'}#clip0",
                                f"{video_folder / 'dogs' / 'broken.mp4'}#clip1"]


@pytest.mark.slow
def test_undecodable_video_is_one_line_naming_it(run_cli, video_folder, tmp_path):
    result = run_cli("ingest", video_folder, tmp_path / "v.zarr", "--frames", "4")
    assert_user_error(result, str(video_folder / "dogs" / "broken.mp4"), "cannot decode video")
    assert nothing_written(tmp_path, "v.zarr")


@pytest.mark.slow
def test_missing_pyav_names_the_extra(run_cli, video_folder, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)  # `import av` raises ImportError
    result = run_cli("ingest", video_folder / "cats" / "v.mp4", tmp_path / "v.zarr")
    assert_user_error(result, "jepa-cli[video]")


@pytest.mark.slow
def test_info_describes_a_video_dataset(run_cli, tmp_path):
    out = tmp_path / "md.zarr"
    assert run_cli("ingest", "builtin:moving-digits", out, "--limit", "2", "-q").exit_code == 0
    info = json.loads(run_cli("info", out, "--json").stdout)
    assert (info["modality"], info["layout"], info["inputs"]["shape"]) == ("video", "NTHWC", [2, 16, 32, 32, 1])


@pytest.mark.slow
def test_split_keeps_the_clips_of_one_video_on_one_side(run_cli, tmp_path):
    np.save(tmp_path / "c.npy", numbered_clips(10, 8))
    sides = {}
    for side in ("train", "test"):
        out = tmp_path / f"{side}.zarr"
        result = run_cli("ingest", tmp_path / "c.npy", out, "--frames", "2", "--clips-per-video", "2",
                         "--split", side, "--test-fraction", "0.3", "--json")
        assert result.exit_code == 0, result.stderr
        sides[side] = read(out / "inputs")[:, 0, 0, 0, 0] // 10  # the video each clip came from
    assert len(sides["test"]) == 6 and len(sides["train"]) == 14
    assert not set(sides["test"].tolist()) & set(sides["train"].tolist())
    assert np.all(np.bincount(sides["test"])[sides["test"]] == 2)


@pytest.mark.slow
def test_info_png_draws_one_row_of_frames_per_clip(run_cli, tmp_path):
    data, png = tmp_path / "md.zarr", tmp_path / "clips.png"
    assert run_cli("ingest", "builtin:moving-digits", data, "--limit", "3", "-q").exit_code == 0
    result = run_cli("info", data, "--png", png, "--samples", "2", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["png"] == str(png)
    with Image.open(png) as picture:  # 16 frames of 32x32 drawn at 64x64, 4-pixel gaps
        assert picture.size == (16 * 68 - 4, 2 * 68 - 4)
        first = np.asarray(picture.convert("L"))[:64, :64]
    np.testing.assert_array_equal(first[::2, ::2], read(data / "inputs")[0, 0, :, :, 0])
    assert_user_error(run_cli("info", data, "--png", png), "already exists")


@pytest.mark.slow
def test_an_empty_clip_folder_is_one_line_naming_it(run_cli, tmp_path):
    root = tmp_path / "clips"
    write_frames(root / "c" / "good", range(4))
    (root / "c" / "empty").mkdir()
    result = run_cli("ingest", root, tmp_path / "f.zarr", "--frames", "4", "--frame-stride", "1")
    assert_user_error(result, str(root / "c" / "empty"), "has no frames")
    assert nothing_written(tmp_path, "f.zarr")
