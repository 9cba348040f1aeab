"""`jepa ingest` of audio (folders of wav/flac/ogg, builtin:tones) and `jepa info` on audio datasets:
docs/formats.md, "Audio datasets"."""

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from conftest import assert_user_error, nothing_written
from conftest import read_zarr as read
from conftest import zarr_attributes as attrs

pytestmark = pytest.mark.slow


def sine(freq: float, rate: int, seconds: float, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(round(rate * seconds))) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


@pytest.fixture
def sounds(tmp_path: Path) -> Path:
    """birds/ (a wav at 16 kHz, a stereo flac in a sub-folder) and dogs/ (an ogg at 8 kHz, a short wav)."""
    root = tmp_path / "sounds"
    (root / "birds" / "deep").mkdir(parents=True)
    (root / "dogs").mkdir()
    sf.write(root / "birds" / "a.wav", sine(440, 16000, 1.5), 16000, subtype="FLOAT")
    stereo = np.stack([sine(220, 16000, 1.0), np.zeros(16000, np.float32)], axis=1)
    sf.write(root / "birds" / "deep" / "b.flac", stereo, 16000)
    sf.write(root / "dogs" / "c.ogg", sine(300, 8000, 1.0), 8000)
    sf.write(root / "dogs" / "d.wav", sine(500, 16000, 0.25), 16000, subtype="FLOAT")
    (root / "dogs" / "notes.txt").write_text("not audio")
    return root


def test_audio_folder_labels_from_top_level_class_folders(run_cli, sounds, tmp_path):
    out = tmp_path / "s.zarr"
    result = run_cli("ingest", sounds, out, "--sample-rate", "16000", "--seconds", "1", "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["shape"] == [4, 16000] and summary["dtype"] == "float32"
    assert read(out / "labels").tolist() == [0, 0, 1, 1]  # birds/a.wav, birds/deep/b.flac, dogs/c.ogg, dogs/d.wav
    a = attrs(out)
    assert (a["modality"], a["layout"], a["sample_rate"], a["seconds"]) == ("audio", "NS", 16000, 1.0)
    assert a["class_names"] == ["birds", "dogs"]
    np.testing.assert_allclose(read(out / "durations"), [1.5, 1.0, 1.0, 0.25])


def test_clips_are_centre_cropped_zero_padded_and_mixed_to_mono(run_cli, sounds, tmp_path):
    out = tmp_path / "s.zarr"
    assert run_cli("ingest", sounds, out, "--sample-rate", "16000", "--seconds", "1").exit_code == 0
    x = read(out / "inputs")
    np.testing.assert_array_equal(x[0], sine(440, 16000, 1.5)[4000:20000])  # the centre second of 1.5 s
    flac = sf.read(sounds / "birds" / "deep" / "b.flac", dtype="float32")[0]
    np.testing.assert_allclose(x[1], flac.mean(axis=1), atol=1e-7)  # mean of the channels
    np.testing.assert_allclose(x[1].max(), 0.25, atol=1e-3)  # (0.5 sine + silence) / 2
    np.testing.assert_array_equal(x[3][4000:], 0.0)  # 0.25 s clip, zero-padded at the end
    np.testing.assert_array_equal(x[3][:4000], sine(500, 16000, 0.25))


def test_train_split_crops_a_seeded_random_window(run_cli, sounds, tmp_path):
    for name in ("a", "b"):
        assert run_cli("ingest", sounds, tmp_path / f"{name}.zarr", "--sample-rate", "16000", "--seconds", "0.5",
                       "--split", "train", "--test-fraction", "0.5", "--seed", "4").exit_code == 0
    x = read(tmp_path / "a.zarr" / "inputs")
    np.testing.assert_array_equal(x, read(tmp_path / "b.zarr" / "inputs"))
    assert attrs(tmp_path / "a.zarr")["crop"] == "random"
    assert read(tmp_path / "a.zarr" / "labels")[0] == 0  # one of the two birds, both longer than 0.5 s
    birds = [sine(440, 16000, 1.5), sf.read(sounds / "birds" / "deep" / "b.flac", dtype="float32")[0].mean(axis=1)]
    starts = [np.flatnonzero(np.all(np.lib.stride_tricks.sliding_window_view(clip, 8000) == x[0], axis=1))
              for clip in birds]
    assert sum(len(s) for s in starts) >= 1  # the row is an 8000-sample window of one of them


def test_resampling_is_band_limited(run_cli, tmp_path):
    root = tmp_path / "rates"
    root.mkdir()
    sf.write(root / "a.wav", sine(1000, 48000, 1.0), 48000, subtype="FLOAT")
    sf.write(root / "b.wav", sine(7000, 48000, 1.0), 48000, subtype="FLOAT")  # above 8 kHz's Nyquist (4 kHz)
    out = tmp_path / "r.zarr"
    assert run_cli("ingest", root, out, "--sample-rate", "8000", "--seconds", "1").exit_code == 0
    x = read(out / "inputs")
    spectrum = np.abs(np.fft.rfft(x[0][1000:7000]))
    assert np.argmax(spectrum) * 8000 / 6000 == pytest.approx(1000, abs=2)
    assert np.sqrt(np.mean(x[0][1000:7000] ** 2)) == pytest.approx(0.5 / np.sqrt(2), rel=0.01)
    assert np.sqrt(np.mean(x[1][1000:7000] ** 2)) < 1e-3  # removed, not aliased to 1 kHz


def test_labels_from_csv_and_from_regex(run_cli, tmp_path):
    root = tmp_path / "digits"
    root.mkdir()
    for name in ("3_a", "1_b", "3_c"):
        sf.write(root / f"{name}.wav", sine(400, 8000, 0.2), 8000)
    (tmp_path / "l.csv").write_text("path,label\n1_b.wav,one\n3_a.wav,three\n3_c.wav,three\n")
    assert run_cli("ingest", root, tmp_path / "c.zarr", "--labels", tmp_path / "l.csv", "--sample-rate", "8000",
                   "--seconds", "0.2").exit_code == 0
    assert attrs(tmp_path / "c.zarr")["class_names"] == ["one", "three"]
    assert read(tmp_path / "c.zarr" / "labels").tolist() == [0, 1, 1]  # files sorted: 1_b, 3_a, 3_c
    assert run_cli("ingest", root, tmp_path / "r.zarr", "--label-regex", r"^(\d+)_", "--sample-rate", "8000",
                   "--seconds", "0.2").exit_code == 0
    assert attrs(tmp_path / "r.zarr")["class_names"] == ["1", "3"]
    assert read(tmp_path / "r.zarr" / "labels").tolist() == [0, 1, 1]


def labelled_digits(tmp_path: Path) -> Path:
    """digits/ with 3_a.wav, 1_b.wav and 3_c.wav (0.2 s at 8 kHz)."""
    root = tmp_path / "digits"
    root.mkdir()
    for name in ("3_a", "1_b", "3_c"):
        sf.write(root / f"{name}.wav", sine(400, 8000, 0.2), 8000)
    return root


def test_a_label_regex_whose_group_does_not_take_part_labels_by_the_whole_match(run_cli, tmp_path):
    root = labelled_digits(tmp_path)
    assert run_cli("ingest", root, tmp_path / "r.zarr", "--label-regex", r"^(x)?\d", "--sample-rate", "8000",
                   "--seconds", "0.2").exit_code == 0
    assert attrs(tmp_path / "r.zarr")["class_names"] == ["1", "3"]
    assert read(tmp_path / "r.zarr" / "labels").tolist() == [0, 1, 1]


def test_a_label_regex_labels_by_the_first_group_that_matched(run_cli, tmp_path):
    root = labelled_digits(tmp_path)
    assert run_cli("ingest", root, tmp_path / "r.zarr", "--label-regex", r"(x)?_(\w)", "--sample-rate", "8000",
                   "--seconds", "0.2").exit_code == 0
    assert attrs(tmp_path / "r.zarr")["class_names"] == ["a", "b", "c"]


def test_a_labels_csv_saved_with_a_byte_order_mark_is_read(run_cli, tmp_path):
    root = labelled_digits(tmp_path)
    (tmp_path / "l.csv").write_bytes("path,label\r\n1_b.wav,one\r\n3_a.wav,three\r\n3_c.wav,three\r\n"
                                     .encode("utf-8-sig"))
    assert run_cli("ingest", root, tmp_path / "c.zarr", "--labels", tmp_path / "l.csv", "--sample-rate", "8000",
                   "--seconds", "0.2").exit_code == 0
    assert attrs(tmp_path / "c.zarr")["class_names"] == ["one", "three"]
    assert read(tmp_path / "c.zarr" / "labels").tolist() == [0, 1, 1]


def test_a_labels_csv_naming_a_file_twice_is_refused_with_both_lines(run_cli, tmp_path):
    root = labelled_digits(tmp_path)
    (tmp_path / "l.csv").write_text("path,label\n1_b.wav,one\n\n3_a.wav,three\n3_c.wav,three\n1_b.wav,two\n")
    result = run_cli("ingest", root, tmp_path / "c.zarr", "--labels", tmp_path / "l.csv", "--sample-rate", "8000")
    assert_user_error(result, f"{tmp_path / 'l.csv'}: names '1_b.wav' twice, on lines 2 and 6")
    assert nothing_written(tmp_path, "c.zarr")


def test_builtin_tones_is_a_seeded_labelled_set(run_cli, tmp_path):
    out = tmp_path / "t.zarr"
    result = run_cli("ingest", "builtin:tones", out, "--sample-rate", "8000", "--seconds", "1", "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["shape"] == [300, 8000] and summary["label_histogram"] == [30] * 10
    assert attrs(out)["class_names"][:3] == ["am-tone", "chirp-down", "chirp-up"]
    durations = read(out / "durations")
    assert 1.0 <= durations.min() and durations.max() <= 2.0 and durations.std() > 0.2
    x = read(out / "inputs")
    assert np.abs(x).max() <= 1.0 and np.all(np.abs(x).max(axis=1) > 0.05)
    from jepa_cli.data.tones import tones_source

    again = tones_source().read(7, 8000)[0]
    np.testing.assert_array_equal(x[7], again[(len(again) - 8000) // 2:][:8000])  # same clip, centre second


def test_info_shows_duration_statistics(run_cli, sounds, tmp_path):
    out = tmp_path / "s.zarr"
    run_cli("ingest", sounds, out, "--sample-rate", "16000", "--seconds", "1")
    info = json.loads(run_cli("info", out, "--json").stdout)
    assert info["modality"] == "audio"
    assert info["duration_seconds"] == {"min": 0.25, "mean": 0.938, "median": 1.0, "max": 1.5, "total": 3.75}


def test_corrupt_file_is_named_or_skipped(run_cli, sounds, tmp_path):
    (sounds / "dogs" / "bad.flac").write_bytes(b"fLaC" + b"\0" * 40)
    out = tmp_path / "s.zarr"
    result = run_cli("ingest", sounds, out, "--sample-rate", "16000", "--seconds", "1")
    assert_user_error(result, "bad.flac", "cannot decode audio")
    assert nothing_written(tmp_path, "s.zarr")
    result = run_cli("ingest", sounds, out, "--sample-rate", "16000", "--seconds", "1", "--skip-bad", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["skipped"] == 1
    assert attrs(out)["skipped"] == [str(sounds / "dogs" / "bad.flac")]
    assert read(out / "labels").tolist() == [0, 0, 1, 1]


def test_skip_bad_with_every_clip_unreadable_is_refused_and_writes_nothing(run_cli, tmp_path):
    folder = tmp_path / "broken" / "dogs"
    folder.mkdir(parents=True)
    (folder / "a.flac").write_bytes(b"fLaC" + b"\0" * 40)
    (folder / "b.wav").write_bytes(b"not audio at all")
    result = run_cli("ingest", tmp_path / "broken", tmp_path / "s.zarr", "--sample-rate", "16000", "--skip-bad")
    assert_user_error(result, "every clip was unreadable, the first because", f"{folder / 'a.flac'}: cannot decode audio")
    assert nothing_written(tmp_path, "s.zarr")


def test_truncated_wav_is_refused(run_cli, sounds, tmp_path):
    data = (sounds / "birds" / "a.wav").read_bytes()
    (sounds / "birds" / "a.wav").write_bytes(data[: len(data) // 2])
    result = run_cli("ingest", sounds, tmp_path / "s.zarr", "--sample-rate", "16000")
    assert_user_error(result, "a.wav", "truncated")
    assert nothing_written(tmp_path, "s.zarr")


@pytest.mark.parametrize("case", ["no-audio", "one-file", "csv-missing-file", "csv-missing-label", "regex-no-match", "seconds-0", "size-on-audio", "rate-on-images"])
def test_bad_audio_input_is_one_line_and_writes_nothing(run_cli, sounds, tmp_path, case):
    args: list = [sounds, tmp_path / "o.zarr"]
    fragments: tuple = ()
    if case == "no-audio":
        empty = tmp_path / "mp3s"
        empty.mkdir()
        (empty / "x.mp3").write_bytes(b"ID3")
        args, fragments = [empty, tmp_path / "o.zarr"], ("no image files", "nor audio files")
    elif case == "one-file":
        args, fragments = [sounds / "birds" / "a.wav", tmp_path / "o.zarr"], ("a.wav: is one audio file",)
    elif case == "csv-missing-file":
        (tmp_path / "l.csv").write_text("birds/a.wav,x\nbirds/deep/b.flac,x\ndogs/c.ogg,y\ndogs/d.wav,y\nzz.wav,y\n")
        args += ["--labels", tmp_path / "l.csv"]
        fragments = ("l.csv", "'zz.wav'")
    elif case == "csv-missing-label":
        (tmp_path / "l.csv").write_text("birds/a.wav,x\n")
        args += ["--labels", tmp_path / "l.csv"]
        fragments = ("no label for 3", "'birds/deep/b.flac'")
    elif case == "regex-no-match":
        args += ["--label-regex", r"^(\d+)_"]
        fragments = ("matches none of the 4",)
    elif case == "seconds-0":
        args += ["--seconds", "0"]
        fragments = ("--seconds must be a positive number",)
    elif case == "size-on-audio":
        args += ["--size", "8x8"]
        fragments = ("--size applies to images only",)
    else:
        args = ["builtin:digits", tmp_path / "o.zarr", "--sample-rate", "8000"]
        fragments = ("--sample-rate applies to audio sources only",)
    assert_user_error(run_cli("ingest", *args), *fragments)
    assert nothing_written(tmp_path, "o.zarr")


def test_probe_refuses_raw_audio_at_two_sample_rates(run_cli, sounds, tmp_path):
    for rate in ("8000", "16000"):
        run_cli("ingest", sounds, tmp_path / f"{rate}.zarr", "--sample-rate", rate, "--seconds", "0.5")
    result = run_cli("probe", "knn", tmp_path / "8000.zarr", tmp_path / "16000.zarr", "--raw", "--k", "1")
    assert_user_error(result, "sample rates differ", "8000 Hz", "16000 Hz")


def test_info_png_draws_spectrograms_of_the_first_clips(run_cli, sounds, tmp_path):
    from PIL import Image

    out = tmp_path / "s.zarr"
    run_cli("ingest", sounds, out, "--sample-rate", "16000", "--seconds", "1")
    result = run_cli("info", out, "--png", tmp_path / "s.png", "--samples", "3", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["png"] == str(tmp_path / "s.png")
    picture = np.asarray(Image.open(tmp_path / "s.png"))
    assert picture.shape == (3 * 128 + 2 * 2, 98)  # 3 x 128 mel rows and 2 gaps; 1 + (16000 - 400) // 160 frames
    # clip 0 is a 440 Hz tone: its brightest row (low frequencies at the bottom) is the same in every frame
    rows = np.argmax(picture[:128, 5:-5], axis=0)
    assert len(set(rows.tolist())) == 1 and rows[0] > 64
    assert_user_error(run_cli("info", out, "--png", tmp_path / "s.png"), "s.png", "--force")
    run_cli("ingest", "builtin:digits", tmp_path / "d.zarr", "--limit", "4")
    assert run_cli("info", tmp_path / "d.zarr", "--png", tmp_path / "d.png").exit_code == 0  # images: the pictures


def test_an_absurd_seconds_is_refused_with_the_sample_count_in_short_form(run_cli, tmp_path):
    result = run_cli("ingest", "builtin:tones", tmp_path / "t.zarr", "--seconds", "1e300")
    assert_user_error(result, "--seconds 1e+300 at 32000 Hz gives 3.2e+304 samples per clip; the limit is 1..67108864")
    assert len(result.stderr) < 200
