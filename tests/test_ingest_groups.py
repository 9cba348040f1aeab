"""`jepa ingest` labels from a CSV or a regex for every folder source, and group-aware splits
(`--group-regex`, `--group-column`): docs/formats.md, "Labels and groups"."""

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from conftest import assert_user_error, nothing_written
from conftest import read_zarr as read
from conftest import zarr_attributes as attrs

SESSIONS = ("s0", "s1", "s2", "s3", "s4")


def png(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((4, 4), value, np.uint8)).save(path)


def image_folder(root: Path) -> Path:
    """cat/ and dog/, each with 2 images from each of 5 sessions: cat/s0_0.png ... dog/s4_1.png."""
    for c, cls in enumerate(("cat", "dog")):
        for s in SESSIONS:
            for i in range(2):
                png(root / cls / f"{s}_{i}.png", 40 * c + i)
    return root


def audio_folder(root: Path) -> Path:
    """Flat wav files `<digit>_<speaker>_<take>.wav`: 2 digits x 5 speakers x 2 takes."""
    root.mkdir()
    for digit in ("1", "2"):
        for s in SESSIONS:
            for take in range(2):
                sf.write(root / f"{digit}_{s}_{take}.wav", np.zeros(80, np.float32), 8000)
    return root


def video_folder(root: Path) -> Path:
    """up/ and down/, each with two 2-frame clip folders from each of 5 source videos: up/s0_clip0/0.png ..."""
    for c, cls in enumerate(("down", "up")):
        for s in SESSIONS:
            for i in range(2):
                for f in range(2):
                    png(root / cls / f"{s}_clip{i}" / f"{f}.png", 10 * c + f)
    return root


SOURCES = {
    "image": (image_folder, ["--group-regex", r"/(s\d)_"]),
    "audio": (audio_folder, ["--label-regex", r"^(\d)_", "--group-regex", r"_(s\d)_", "--sample-rate", "8000",
                             "--seconds", "0.01"]),
    "video": (video_folder, ["--group-regex", r"/(?P<video>s\d)_clip", "--frames", "2", "--frame-stride", "1"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("modality", sorted(SOURCES))
def test_no_group_lies_on_both_sides_of_the_split(run_cli, tmp_path, modality):
    make, args = SOURCES[modality]
    root = make(tmp_path / "src")
    sides = {}
    for split in ("train", "test"):
        out = tmp_path / f"{split}.zarr"
        result = run_cli("ingest", root, out, *args, "--split", split, "--test-fraction", "0.4", "--seed", "3")
        assert result.exit_code == 0, result.stderr
        sides[split] = attrs(out)["split"]
        assert attrs(out)["num_samples"] == 4 * len(sides[split]["groups"])  # every sample of each of its groups
    assert set(sides["train"]["groups"]).isdisjoint(sides["test"]["groups"])
    assert sorted(sides["train"]["groups"] + sides["test"]["groups"]) == list(SESSIONS)
    assert len(sides["test"]["groups"]) == 2  # 0.4 of 20 samples: 8, two groups of 4
    assert sides["test"]["group_regex"] == args[args.index("--group-regex") + 1]


@pytest.mark.slow
def test_a_group_split_is_the_same_for_the_same_seed(run_cli, tmp_path):
    root = image_folder(tmp_path / "src")
    groups = []
    for name in ("a", "b"):
        result = run_cli("ingest", root, tmp_path / f"{name}.zarr", "--group-regex", r"/(s\d)_", "--split", "test",
                         "--seed", "7")
        assert result.exit_code == 0, result.stderr
        groups.append(attrs(tmp_path / f"{name}.zarr")["split"]["groups"])
    assert groups[0] == groups[1] and len(groups[0]) == 1  # 0.2 of 20 samples: one group of 4


def test_a_test_fraction_that_would_take_every_group_leaves_one_for_train():
    from jepa_cli.data.splits import split_indices

    # 0.9 of 6 samples is 5: the two groups of 3 both bring the test side closer to 5, but one stays
    groups = np.array([0, 0, 0, 1, 1, 1])
    for seed in range(4):
        test = split_indices(None, 6, "test", 0.9, seed, groups)
        train = split_indices(None, 6, "train", 0.9, seed, groups)
        assert len(test) == len(train) == 3 and len(set(groups[test])) == len(set(groups[train])) == 1
        assert sorted(np.concatenate([test, train])) == list(range(6))


@pytest.mark.slow
def test_image_labels_from_a_csv_replace_the_class_folders(run_cli, tmp_path):
    root = tmp_path / "flat"
    for name, value in (("a.png", 0), ("b.png", 9), ("c.png", 18)):
        png(root / name, value)
    (tmp_path / "l.csv").write_text("path,label\na.png,zebra\nb.png,ant\nc.png,zebra\n")
    result = run_cli("ingest", root, tmp_path / "o.zarr", "--labels", tmp_path / "l.csv")
    assert result.exit_code == 0, result.stderr
    assert attrs(tmp_path / "o.zarr")["class_names"] == ["ant", "zebra"]
    assert read(tmp_path / "o.zarr" / "labels").tolist() == [1, 0, 1]


@pytest.mark.slow
def test_image_labels_from_a_regex_over_the_file_stems(run_cli, tmp_path):
    root = image_folder(tmp_path / "src")
    result = run_cli("ingest", root, tmp_path / "o.zarr", "--label-regex", r"^(s\d)_")
    assert result.exit_code == 0, result.stderr
    assert attrs(tmp_path / "o.zarr")["class_names"] == list(SESSIONS)
    assert read(tmp_path / "o.zarr" / "labels").tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4] * 2


@pytest.mark.slow
def test_groups_from_a_column_of_the_labels_csv(run_cli, tmp_path):
    root = audio_folder(tmp_path / "src")
    rows = [f"{p.name},{p.name[0]},{p.name[2:4]}" for p in sorted(root.iterdir())]
    (tmp_path / "l.csv").write_text("path,label,Speaker\n" + "\n".join(rows) + "\n")
    result = run_cli("ingest", root, tmp_path / "o.zarr", "--labels", tmp_path / "l.csv", "--group-column", "speaker",
                     "--split", "train", "--sample-rate", "8000", "--seconds", "0.01", "--json")
    assert result.exit_code == 0, result.stderr
    split = attrs(tmp_path / "o.zarr")["split"]
    assert split["group_column"] == "speaker" and len(split["groups"]) == 4
    assert json.loads(result.stdout)["groups"] == 4


@pytest.mark.slow
@pytest.mark.parametrize("modality", ["image", "audio"])
def test_the_summary_names_the_one_group_held_out(run_cli, tmp_path, modality):
    make, flags = SOURCES[modality]
    root = make(tmp_path / "src")
    # 0.2 of 20 samples: 4, one session of 4 samples (each session is 2 classes x 2)
    result = run_cli("ingest", root, tmp_path / "o.zarr", *flags, "--split", "test", "--test-fraction", "0.2")
    assert result.exit_code == 0, result.stderr
    held_out = attrs(tmp_path / "o.zarr")["split"]["groups"]
    assert len(held_out) == 1 and held_out[0] in SESSIONS
    assert f", 1 group ({held_out[0]})" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("case", ["bad-regex", "regex-matches-nothing", "column-missing", "no-split", "one-group",
                                  "group-regex-on-an-array"])
def test_a_bad_group_option_is_one_line_and_writes_nothing(run_cli, tmp_path, case):
    root = image_folder(tmp_path / "src")
    args = [root, tmp_path / "o.zarr", "--split", "train"]
    if case == "bad-regex":
        args += ["--group-regex", "(s"]
        fragments = ("--group-regex '(s' is not a valid regular expression",)
    elif case == "regex-matches-nothing":
        args += ["--group-regex", r"^zz(\d)"]
        fragments = ("--group-regex", "matches none of the 20")
    elif case == "column-missing":
        rows = [f"{p.parent.name}/{p.name},{p.parent.name}" for p in sorted(root.glob("*/*.png"))]
        (tmp_path / "l.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
        args += ["--labels", tmp_path / "l.csv", "--group-column", "session"]
        fragments = ("l.csv: has no column 'session'", "path, label")
    elif case == "no-split":
        args = [root, tmp_path / "o.zarr", "--group-regex", r"/(s\d)_"]
        fragments = ("give --split train or --split test",)
    elif case == "one-group":
        args += ["--group-regex", r"(png)$"]
        fragments = ("one group for all 20 samples",)
    else:
        np.save(tmp_path / "x.npy", np.zeros((4, 4, 4), np.uint8))
        args = [tmp_path / "x.npy", tmp_path / "o.zarr", "--split", "train", "--group-regex", "x"]
        fragments = ("--group-regex applies to a folder source",)
    assert_user_error(run_cli("ingest", *args), *fragments)
    assert nothing_written(tmp_path, "o.zarr")


@pytest.mark.slow
def test_info_shows_a_long_group_list_as_its_count_and_first_names(run_cli, tmp_path):
    root = tmp_path / "src"
    for i in range(24):
        png(root / f"p{i:02d}_0.png", i)
    assert run_cli("ingest", root, tmp_path / "o.zarr", "--group-regex", r"^(p\d+)_", "--split", "train").exit_code == 0
    result = run_cli("info", tmp_path / "o.zarr", env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.stderr
    shown = " ".join(result.stdout.split())
    assert '"groups": "19 names: p00, p01, p02, ..."' in shown  # 24 - round(24 * 0.2) on the train side
