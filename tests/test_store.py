"""The shared write and read layer (jepa_cli/data/: store.py, atomic.py, locks.py, resources.py): what
every atomic writer gets (ingest, `jepa mask -o`, encode-latents' final move) and how damaged arrays
are reported."""

import fcntl
import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from jepa_cli.data import atomic, resources, store
from jepa_cli import errors
from jepa_cli.errors import InputError


def make_artifact(path: Path, kind: str = "dataset") -> Path:
    store.write_group(path, store.base_attributes(kind))
    store.write_array(path / "payload", np.ones(3, np.uint8))
    return path


def write_dataset(path: Path, rows: int = 3) -> Path:
    with atomic.atomic_directory(path, False, "dataset") as tmp:
        store.write_array(tmp / "inputs", np.arange(rows * 4, dtype=np.uint8).reshape(rows, 2, 2, 1))
        store.write_group(tmp, store.base_attributes("dataset"))
    return path


# --- --force replaces only an artifact of the same kind -------------------------------------------

@pytest.mark.slow
def test_force_replaces_an_artifact_of_the_same_kind(tmp_path):
    out = make_artifact(tmp_path / "d.zarr")
    assert atomic.check_output(out, True, "dataset") == out


@pytest.mark.slow
@pytest.mark.parametrize("found", ["masks", "run"])
def test_force_refuses_an_artifact_of_another_kind(tmp_path, found):
    out = make_artifact(tmp_path / "d.zarr", found)
    with pytest.raises(InputError, match=f"holds jepa_kind '{found}'.*jepa_kind 'dataset'"):
        atomic.check_output(out, True, "dataset")


@pytest.mark.slow
def test_force_refuses_a_users_folder(tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "a.jpg").write_bytes(b"x")
    with pytest.raises(InputError, match="photos: is not a jepa output"):
        atomic.check_output(tmp_path / "photos", True, "dataset")


@pytest.mark.slow
def test_an_existing_artifact_needs_force(tmp_path):
    out = make_artifact(tmp_path / "d.zarr")
    with pytest.raises(InputError, match="d.zarr: already exists \\(use --force to overwrite\\)"):
        atomic.check_output(out, False, "dataset")


@pytest.mark.slow
def test_without_force_a_users_folder_is_refused_without_suggesting_force(tmp_path):
    (tmp_path / "photos").mkdir()
    with pytest.raises(InputError, match="photos: is not a jepa output.*remove it yourself or choose another output"):
        atomic.check_output(tmp_path / "photos", False, "dataset")


@pytest.mark.slow
def test_force_refuses_a_file_and_a_symbolic_link(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "link").symlink_to(make_artifact(tmp_path / "d.zarr"))
    with pytest.raises(InputError, match="notes.txt: is a file"):
        atomic.check_output(tmp_path / "notes.txt", True, "dataset")
    with pytest.raises(InputError, match="link: is a symbolic link"):
        atomic.check_output(tmp_path / "link", True, "dataset")


# --- outputs never overlap inputs -------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("output, relation", [("src", "is the input"), ("src/in.zarr", "lies inside the input"),
                                              (".", "contains the input"), ("alias/in.zarr", "lies inside the input")])
def test_output_overlapping_an_input_is_refused(tmp_path, monkeypatch, output, relation):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "src")
    with pytest.raises(InputError, match=f"^{output}: the output {relation} src;"):
        atomic.check_output(output, True, "dataset", ["src"])


@pytest.mark.slow
def test_a_sibling_sharing_a_name_prefix_is_not_an_overlap(tmp_path):
    (tmp_path / "src").mkdir()
    assert atomic.check_output(tmp_path / "src.zarr", False, "dataset", [tmp_path / "src"]) == tmp_path / "src.zarr"


# --- the final move never replaces what appeared meanwhile ------------------------------------------

@pytest.mark.slow
def test_rename_no_replace_refuses_an_existing_empty_directory(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(FileExistsError):
        atomic.rename_no_replace(tmp_path / "a", tmp_path / "b")
    assert (tmp_path / "a").is_dir() and list((tmp_path / "b").iterdir()) == []


@pytest.mark.slow
def test_rename_no_replace_without_renameat2_uses_the_directory_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "_renameat2", None)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(FileExistsError):
        atomic.rename_no_replace(tmp_path / "a", tmp_path / "b")
    atomic.rename_no_replace(tmp_path / "a", tmp_path / "c")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "c"]


@pytest.mark.slow
@pytest.mark.parametrize("renameat2", ["native", "fallback"])
def test_a_write_whose_target_appeared_meanwhile_fails_and_keeps_the_other(tmp_path, monkeypatch, renameat2):
    if renameat2 == "fallback":
        monkeypatch.setattr(atomic, "_renameat2", None)
    out = tmp_path / "d.zarr"
    with pytest.raises(InputError, match="d.zarr: already exists \\(another process wrote it"):
        with atomic.atomic_directory(out, False, "dataset") as tmp:
            store.write_group(tmp, store.base_attributes("dataset", source="mine"))
            out.mkdir()  # a concurrent writer finished first: even an empty directory is kept
    assert list(out.iterdir()) == []
    assert [p.name for p in tmp_path.iterdir()] == ["d.zarr"]  # and our partial is gone


@pytest.mark.slow
def test_force_checks_the_kind_again_at_move_time(tmp_path):
    out = make_artifact(tmp_path / "d.zarr")
    with pytest.raises(InputError, match="d.zarr: is not a jepa output"):
        with atomic.atomic_directory(out, True, "dataset") as tmp:
            store.write_group(tmp, store.base_attributes("dataset"))
            (out / "zarr.json").unlink()  # meanwhile a user's folder took the dataset's place
    assert sorted(p.name for p in out.iterdir()) == ["payload"]
    assert [p.name for p in tmp_path.iterdir()] == ["d.zarr"]


@pytest.mark.slow
def test_force_swaps_an_artifact_in_and_removes_the_old_one(tmp_path):
    out = make_artifact(tmp_path / "d.zarr")
    with atomic.atomic_directory(out, True, "dataset") as tmp:
        store.write_group(tmp, store.base_attributes("dataset", source="new"))
    assert store.read_attributes(out)["source"] == "new" and not (out / "payload").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["d.zarr"]


# --- stale partials ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_stale_partial_is_removed_by_the_next_write_and_reported(tmp_path):
    stale = tmp_path / ".d.zarr.partial-0123abcd"
    stale.mkdir()
    (stale / "chunk").write_bytes(b"x" * 100)
    lines: list[str] = []
    with atomic.atomic_directory(tmp_path / "d.zarr", False, "dataset", log=lines.append) as tmp:
        store.write_group(tmp, store.base_attributes("dataset"))
    assert lines == [f"removed {stale}, left by an interrupted write whose process is gone"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.zarr"]


@pytest.mark.slow
def test_a_live_writers_partial_is_kept(tmp_path):
    live = tmp_path / ".d.zarr.partial-0123abcd"
    live.mkdir()
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what its writer holds while it runs
    try:
        assert atomic.remove_stale_partials(tmp_path / "d.zarr") == []
    finally:
        os.close(fd)
    assert live.is_dir()


@pytest.mark.slow
def test_a_writer_locks_its_own_partial(tmp_path):
    with atomic.atomic_directory(tmp_path / "d.zarr", False, "dataset") as tmp:
        assert atomic.remove_stale_partials(tmp_path / "d.zarr") == []
        assert tmp.is_dir()
        store.write_group(tmp, store.base_attributes("dataset"))


@pytest.mark.slow
def test_only_this_outputs_partials_are_touched(tmp_path):
    keep = [tmp_path / ".d.zarr.partial", tmp_path / ".e.zarr.partial-0123abcd", tmp_path / ".d.zarr.partial-notahex"]
    for path in keep:
        path.mkdir()
    assert atomic.remove_stale_partials(tmp_path / "d.zarr") == []
    assert all(path.is_dir() for path in keep)


@pytest.mark.slow
def test_a_swapped_out_old_output_is_removed_once_the_output_exists(tmp_path):
    old = make_artifact(tmp_path / ".d.zarr.old-0123abcd")
    assert atomic.remove_stale_partials(tmp_path / "d.zarr") == []  # no d.zarr: it may be the only copy
    (tmp_path / "d.zarr").mkdir()
    assert atomic.remove_stale_partials(tmp_path / "d.zarr") == [
        f"removed {old}, an output replaced by an interrupted --force write"]
    assert not old.exists()


@pytest.mark.slow
def test_a_swapped_out_folder_that_is_not_a_jepa_output_is_kept(tmp_path):
    old = tmp_path / ".d.zarr.old-0123abcd"
    old.mkdir()
    (tmp_path / "d.zarr").mkdir()
    assert atomic.remove_stale_partials(tmp_path / "d.zarr") == [] and old.is_dir()


# --- damaged arrays and metadata ----------------------------------------------------------------------

class _Write:
    """A TensorStore write future whose first `interrupted` waits are interrupted by a signal while the
    write goes on; the wait after them sees it finish."""

    def __init__(self, interrupted: int = 0):
        self.interrupted = interrupted
        self.waits = 0
        self.finished = False

    def done(self) -> bool:
        return self.finished

    def result(self) -> None:
        self.waits += 1
        if self.waits <= self.interrupted:
            raise KeyboardInterrupt
        self.finished = True


def test_a_signal_during_a_write_waits_for_the_write_before_it_propagates():
    # else the write lands in the partial output while the interrupted command removes it
    write = _Write(interrupted=1)
    with pytest.raises(KeyboardInterrupt):
        store.complete(lambda: write)
    assert write.finished and write.waits == 2


def test_a_signal_while_a_write_starts_is_raised_only_once_its_future_is_in_hand():
    # a signal raised as the call that starts the write returns would drop the future unwaited
    write = _Write()

    def start():
        errors.raise_terminated(signal.SIGTERM, None)  # what the handler does when SIGTERM lands here
        return write

    with pytest.raises(errors.Terminated):
        store.complete(start)
    assert write.waits == 1 and write.finished


@pytest.mark.slow
def test_a_truncated_chunk_names_the_array_and_the_chunk(tmp_path):
    write_dataset(tmp_path / "d.zarr")
    chunk = tmp_path / "d.zarr" / "inputs" / "c" / "0" / "0" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:5])
    with pytest.raises(InputError, match=f"^{tmp_path}/d.zarr/inputs: chunk c/0/0/0/0 is damaged \\(Truncated"):
        store.read_array(tmp_path / "d.zarr" / "inputs")


@pytest.mark.slow
def test_read_returns_the_requested_rows(tmp_path):
    write_dataset(tmp_path / "d.zarr")
    rows = store.read(store.open_array(tmp_path / "d.zarr" / "inputs"), slice(1, 3))
    assert rows.reshape(2, 4).tolist() == [[4, 5, 6, 7], [8, 9, 10, 11]]


@pytest.mark.slow
@pytest.mark.parametrize("text, problem", [("{garbage", "corrupt zarr metadata"), ("[]", "not the metadata"),
                                           (json.dumps({"node_type": "array"}), "not the metadata")])
def test_damaged_group_metadata_is_named_with_the_fix(tmp_path, text, problem):
    write_dataset(tmp_path / "d.zarr")
    (tmp_path / "d.zarr" / "zarr.json").write_text(text)
    with pytest.raises(InputError, match=f"d.zarr/zarr.json: {problem}.*jepa ingest ... --force"):
        store.read_attributes(tmp_path / "d.zarr")


@pytest.mark.slow
def test_damaged_array_metadata_is_named(tmp_path):
    write_dataset(tmp_path / "d.zarr")
    (tmp_path / "d.zarr" / "inputs" / "zarr.json").write_text("{garbage")
    with pytest.raises(InputError, match="inputs/zarr.json: cannot open as a zarr v3 array \\(Invalid JSON\\)"):
        store.open_array(tmp_path / "d.zarr" / "inputs")


# --- names and resources --------------------------------------------------------------------------------

@pytest.mark.slow
def test_attributes_hold_non_utf8_names_as_escaped_utf8(tmp_path):
    name = os.fsdecode(b"caf\xe9")
    store.write_group(tmp_path / "g", {"class_names": [name], name: "x"})
    raw = (tmp_path / "g" / "zarr.json").read_bytes()
    raw.decode("utf-8")  # valid UTF-8, and no lone surrogate escapes
    assert b"\\ud" not in raw
    assert store.read_attributes(tmp_path / "g") == {"class_names": ["caf\\xe9"], "caf\\xe9": "x"}


@pytest.mark.slow
def test_an_output_path_that_is_not_utf8_is_refused(tmp_path):
    with pytest.raises(InputError, match=r"caf\\xe9.zarr: the path is not valid UTF-8"):
        atomic.check_output(tmp_path / os.fsdecode(b"caf\xe9.zarr"), False, "dataset")


@pytest.mark.slow
def test_check_room_refuses_more_disk_than_is_free(tmp_path, monkeypatch):
    monkeypatch.setattr(resources.shutil, "disk_usage", lambda path: SimpleNamespace(total=8 << 20, used=7 << 20,
                                                                                 free=1 << 20))
    with pytest.raises(InputError, match=r"o.zarr: needs about 2.0 MiB of disk but 1.0 MiB is free in .*; hint"):
        resources.check_room(tmp_path / "o.zarr", 2 << 20, 0, "hint", "unused")


def test_format_bytes():
    assert [resources.format_bytes(n) for n in (512, 1536, 3 << 30, 7 << 40)] == ["512 B", "1.5 KiB", "3.0 GiB", "7.0 TiB"]


# --- replacing a kept file ---------------------------------------------------------------------------

@pytest.mark.slow
def test_a_file_replaced_on_a_full_disk_keeps_its_old_bytes_and_leaves_no_sibling(tmp_path):
    from conftest import file_size_limit

    from jepa_cli.data.files import replace_file

    path = tmp_path / "run.json"
    path.write_bytes(b"old")
    with pytest.raises(OSError):
        with file_size_limit(4096):
            replace_file(path, b"x" * 10_000)
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]
    replace_file(path, b"new")
    assert path.read_bytes() == b"new" and sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]
