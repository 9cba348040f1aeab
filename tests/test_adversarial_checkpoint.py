"""Hostile-user cases for checkpoints: crafted PyTorch files given to `jepa import-checkpoint`,
damaged or hand-edited run checkpoints given to their readers, and checkpoints rotated out while
a reader reads them. Most cases run in-process (the `run_cli` fixture, or the library functions);
a few go through the real CLI (tests/adversarial.py).

Crafted `torch.save` files are built here without torch: a protocol-2 pickle whose globals are
written as `torch._utils._rebuild_tensor_v2` and `torch.FloatStorage` (tests/data/official_ijepa_tiny.pth.tar,
written by real torch, has the same layout), with each tensor's storage offset, size and stride
chosen by the test."""

from __future__ import annotations

import collections
import io
import pickle
import sys
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_user_error, file_size_limit

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data"
OFFICIAL = DATA / "official_ijepa_tiny.pth.tar"
# the golden model of tests/data/official_ijepa_tiny.pth.tar (as in tests/test_import_checkpoint.py)
TINY = ["--model", "tiny", "--width", "64", "--depth", "2", "--heads", "4", "--patch-size", "4", "--image-size", "32",
        "--pred-width", "32", "--pred-depth", "2", "--pred-heads", "4", "--ipe", "10", "--epochs", "20"]


# -- crafted torch.save files ---------------------------------------------------------------------

_UTILS, _TORCH = "jepa_crafted_torch_utils", "jepa_crafted_torch"  # renamed to torch._utils / torch in the bytes


class Tensor:
    """A tensor to write: `values` become its storage's bytes; offset, size and stride are written as given."""

    def __init__(self, values, offset: int = 0, size=None, stride=None, key: str | None = None):
        self.values = np.ascontiguousarray(values, np.float32).ravel()
        shape = np.shape(values)
        self.offset = offset
        self.size = tuple(shape) if size is None else size
        self.stride = tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape))) if stride is None else stride
        self.key = key


def write_torch_file(path: Path, obj, numel: dict[str, int] | None = None) -> Path:
    """`obj` (dicts, lists, numbers, Tensor) as a torch.save zip file. `numel` overrides the element
    count a storage declares, by key."""
    utils, torch_mod = types.ModuleType(_UTILS), types.ModuleType(_TORCH)

    def _rebuild_tensor_v2(*args):  # never called: only its name is pickled
        raise AssertionError

    class FloatStorage:
        pass

    _rebuild_tensor_v2.__module__, _rebuild_tensor_v2.__qualname__ = _UTILS, "_rebuild_tensor_v2"
    FloatStorage.__module__, FloatStorage.__qualname__ = _TORCH, "FloatStorage"
    utils._rebuild_tensor_v2, torch_mod.FloatStorage = _rebuild_tensor_v2, FloatStorage
    storages: dict[str, bytes] = {}

    class Ref:
        def __init__(self, key: str, count: int):
            self.key, self.count = key, count

    class Reduced:
        def __init__(self, tensor: Tensor):
            self.tensor = tensor

        def __reduce__(self):
            t = self.tensor
            key = t.key or str(len(storages))
            storages[key] = t.values.tobytes()
            count = (numel or {}).get(key, t.values.size)
            return _rebuild_tensor_v2, (Ref(key, count), t.offset, t.size, t.stride, False, collections.OrderedDict())

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", FloatStorage, obj.key, "cpu", obj.count) if isinstance(obj, Ref) else None

    def wrap(value):
        if isinstance(value, Tensor):
            return Reduced(value)
        if isinstance(value, dict):
            return {k: wrap(v) for k, v in value.items()}
        return value

    buffer = io.BytesIO()
    saved = {name: sys.modules.get(name) for name in (_UTILS, _TORCH)}
    sys.modules.update({_UTILS: utils, _TORCH: torch_mod})
    try:
        Pickler(buffer, protocol=2).dump(wrap(obj))
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
    payload = buffer.getvalue().replace(f"c{_UTILS}\n".encode(), b"ctorch._utils\n")
    payload = payload.replace(f"c{_TORCH}\n".encode(), b"ctorch\n")
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", payload)
        archive.writestr("archive/byteorder", "little")
        for key, raw in storages.items():
            archive.writestr(f"archive/data/{key}", raw)
    return path


def official_with(path: Path, change) -> Path:
    """The official tiny checkpoint, read and written again as a crafted file after change(checkpoint)."""
    from jepa_cli.models.torch_checkpoint import read_torch_checkpoint

    checkpoint = read_torch_checkpoint(OFFICIAL)
    for part in ("encoder", "predictor", "target_encoder"):
        checkpoint[part] = {k: Tensor(v) for k, v in checkpoint[part].items()}
    change(checkpoint)
    return write_torch_file(path, checkpoint)


def test_crafted_files_read_back_as_written(tmp_path):
    from jepa_cli.models.torch_checkpoint import read_torch_checkpoint

    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = read_torch_checkpoint(write_torch_file(tmp_path / "ok.pt", {"w": Tensor(values), "epoch": 2,
                                                                      "t": Tensor(values, size=(4, 3), stride=(1, 4))}))
    np.testing.assert_array_equal(got["w"], values)
    np.testing.assert_array_equal(got["t"], values.T)
    assert got["epoch"] == 2


# -- 1: storage offsets, sizes and strides ----------------------------------------------------------

@pytest.mark.parametrize("offset, size, stride, why", [
    (-1, (4,), (1,), "storage offset"),  # a view from before the storage: memory of the process
    (0, (2, 3, 4), (4096, -100000, 1), "stride"),  # a view far outside the storage: a crash
    (0, (-3,), (1,), "size"),
    (0, (10**6,), (1,), "past the end"),
    (0, (2, 2), (2**62, 2**62), "past the end"),  # offset + extent beyond 64 bits
    (2**70, (1,), (1,), "past the end"),
    (12, (), (), "past the end"),  # a scalar one past the last element
    (0, (3,), (1, 1), "one length"),
    (0, (True, 2), (1, 1), "size"),
    (0, (1.5,), (1,), "size"),
    (0, "abc", (1,), "one length"),
])
def test_a_tensor_outside_its_storage_is_refused_before_any_view(tmp_path, offset, size, stride, why):
    from jepa_cli.errors import InputError
    from jepa_cli.models.torch_checkpoint import read_torch_checkpoint

    path = write_torch_file(tmp_path / "bad.pt", {"w": Tensor(np.zeros(12), offset=offset, size=size, stride=stride)})
    with pytest.raises(InputError, match=why) as caught:
        read_torch_checkpoint(path)
    assert str(caught.value).startswith(f"{path}: damaged PyTorch checkpoint")


def test_a_zero_stride_tensor_larger_than_memory_is_refused_before_it_is_allocated(tmp_path):
    from jepa_cli.errors import InputError
    from jepa_cli.models.torch_checkpoint import read_torch_checkpoint

    path = write_torch_file(tmp_path / "huge.pt", {"w": Tensor(np.zeros(1), size=(10**9, 10**9), stride=(0, 0))})
    with pytest.raises(InputError, match="more than the .* of memory left"):
        read_torch_checkpoint(path)


def test_a_storage_declaring_more_elements_than_its_bytes_is_refused(tmp_path):
    from jepa_cli.errors import InputError
    from jepa_cli.models.torch_checkpoint import read_torch_checkpoint

    path = write_torch_file(tmp_path / "short.pt", {"w": Tensor(np.zeros(4), key="0")}, numel={"0": 2**60})
    with pytest.raises(InputError, match="storage 0 is shorter than its 1152921504606846976 elements"):
        read_torch_checkpoint(path)


def test_import_of_a_tensor_with_a_negative_offset_is_one_line_and_writes_nothing(run_cli, tmp_path):
    def shift(checkpoint):
        checkpoint["encoder"]["module.pos_embed"].offset = -1

    (tmp_path / "in").mkdir()
    source = official_with(tmp_path / "in" / "bad.pth.tar", shift)
    out = tmp_path / "out"
    assert_user_error(run_cli("import-checkpoint", source, "-o", out, *TINY), str(source), "storage offset")
    assert not out.exists()


# -- 12: non-finite weights -----------------------------------------------------------------------

@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_import_of_non_finite_weights_names_the_tensor_and_writes_nothing(run_cli, tmp_path, bad):
    def poison(checkpoint):
        checkpoint["target_encoder"]["module.blocks.1.mlp.fc2.weight"].values[[3, 7]] = bad

    (tmp_path / "in").mkdir()
    source = official_with(tmp_path / "in" / "nan.pth.tar", poison)
    out = tmp_path / "out"
    assert_user_error(run_cli("import-checkpoint", source, "-o", out, *TINY),
                      "target_encoder tensor blocks.1.mlp.fc2.weight holds 2 non-finite value(s)")  # wrapper prefix off
    assert not out.exists()


# -- run checkpoints: digests, saved config, data state, rotation ------------------------------------

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory) -> Path:
    """A toy run trained in this process to step 6, checkpoints at 2, 4 and 6 (asynchronous saves)."""
    from test_adversarial_train import _write_images

    from jepa_cli.training.config import build_config
    from jepa_cli.training.loop import train

    root = tmp_path_factory.mktemp("toyrun")
    data = _write_images(root / "toy.zarr", 64, 8)
    train(build_config(dict(objective="toy_objective:make", data=str(data), out=str(root / "run"), steps=6,
                            batch_size=16, mesh="data=1", save_every=2, warmup_steps=1, keep=0)))
    return root / "run"


@pytest.fixture
def run(toy_run, tmp_path) -> Path:
    """A copy of the toy run that a test may damage."""
    import shutil

    return Path(shutil.copytree(toy_run, tmp_path / "run", symlinks=True))


def flip_a_byte(run: Path, step: int) -> Path:
    """Flips one bit in the middle of the largest data file of checkpoint `step`'s state; returns it."""
    files = [p for p in (run / "checkpoints" / str(step) / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    target = max(files, key=lambda p: p.stat().st_size)
    raw = bytearray(target.read_bytes())
    raw[len(raw) // 2] ^= 1
    target.write_bytes(bytes(raw))
    return target


def test_every_saved_step_has_the_sha256_of_each_of_its_files(toy_run):
    import hashlib
    import json

    from jepa_cli.training.digest import DIGEST_FILE

    for step in (2, 4, 6):
        step_dir = toy_run / "checkpoints" / str(step)
        record = json.loads((step_dir / DIGEST_FILE).read_text())
        state_files = sorted(str(p.relative_to(step_dir)) for p in (step_dir / "state").rglob("*") if p.is_file())
        assert record["algorithm"] == "sha256"
        assert [name for name in record["files"] if name.startswith("state/")] == state_files
        assert all(record["files"][name] == hashlib.sha256((step_dir / name).read_bytes()).hexdigest()
                   for name in record["files"])


def test_a_flipped_byte_is_reported_with_its_step_and_the_newest_intact_step(run, run_cli):
    damaged = flip_a_byte(run, 6)
    line = "checkpoint at step 6 is unreadable, its files changed since it was saved"
    assert_user_error(run_cli("ema-inspect", run, "--step", "6"), line, damaged.name,
                      "the newest intact checkpoint is step 4 (--step 4)")


def test_the_latest_checkpoint_with_a_flipped_byte_is_skipped_for_the_newest_intact_one(run):
    from jepa_cli.training.run import load_run

    flip_a_byte(run, 6)
    messages = []
    _config, _objective, _host, step = load_run(run, on_fallback=lambda s, m: messages.append((s, m)))
    assert step == 4
    assert [s for s, _ in messages] == [6]
    assert "step 6 is unreadable, its files changed" in messages[0][1]
    assert "using step 4, the newest intact checkpoint" in messages[0][1]


def test_a_checkpoint_saved_without_a_digest_still_restores(run, toy_run):
    from jepa_cli.training.digest import DIGEST_FILE
    from jepa_cli.training.run import load_run, params_sha256

    (run / "checkpoints" / "6" / DIGEST_FILE).unlink()
    _config, _objective, host, step = load_run(run)
    assert step == 6
    assert params_sha256(host) == params_sha256(load_run(toy_run)[2])


def test_a_damaged_digest_file_names_itself(run, run_cli):
    from jepa_cli.training.digest import DIGEST_FILE

    (run / "checkpoints" / "6" / DIGEST_FILE).write_text("{not json")
    assert_user_error(run_cli("ema-inspect", run, "--step", "6"), f"{DIGEST_FILE} is damaged",
                      "the newest intact checkpoint is step 4")


def test_resume_moves_a_checkpoint_with_a_flipped_byte_aside_and_trains_its_step_again(run, run_cli):
    import json

    from jepa_cli.training.digest import digest_problem

    flip_a_byte(run, 6)
    data = json.loads((run / "run.json").read_text())["config"]["data"]
    result = run_cli("train", "--objective", "toy_objective:make", "--mesh", "data=1", "--batch-size", "16",
                     "--data", data, "--out", run, "--steps", "6", "--save-every", "2", "--resume",
                     env={"PYTHONPATH": str(TESTS)})
    assert result.exit_code == 0, result.stderr
    assert "step 6 is unreadable, its files changed" in result.stderr
    assert "using step 4, the newest intact checkpoint" in result.stderr
    assert (run / "unreadable-checkpoints" / "6" / "state").is_dir()
    assert digest_problem(run / "checkpoints" / "6") is None


def test_the_checkpoints_saved_config_wins_over_a_hand_edited_run_json(run):
    import json

    from jepa_cli.training.run import load_run

    record = json.loads((run / "run.json").read_text())
    record["config"]["objective_config"]["image_size"] = 16
    (run / "run.json").write_text(json.dumps(record))
    config, objective, host, step = load_run(run)
    assert config["objective_config"]["image_size"] == 8
    assert objective.config.image_size == 8
    assert host["params"]["encoder"]["kernel"].shape == (64, 16)


@pytest.mark.parametrize("state", [{"next_index": 10**30}, {"next_index": -1}, {"next_index": 2.5},
                                   {"next_index": "4"}, {"next_index": True}, ["next_index", 4]])
def test_an_absurd_data_state_is_a_damaged_checkpoint(run, run_cli, state):
    import json

    from jepa_cli.training.digest import DIGEST_FILE

    (run / "checkpoints" / "6" / DIGEST_FILE).unlink()  # as a checkpoint written before digests existed
    (run / "checkpoints" / "6" / "data" / "metadata").write_text(json.dumps(state))
    assert_user_error(run_cli("ema-inspect", run, "--step", "6"), "checkpoint at step 6 is unreadable",
                      "data state", "the newest intact checkpoint is step 4")


def test_a_data_state_that_does_not_fit_the_dataset_stops_resume_in_one_line(run, run_cli):
    import json

    from jepa_cli.training.digest import DIGEST_FILE

    (run / "checkpoints" / "6" / DIGEST_FILE).unlink()
    (run / "checkpoints" / "6" / "data" / "metadata").write_text(json.dumps({"epoch": 5}))
    data = json.loads((run / "run.json").read_text())["config"]["data"]
    result = run_cli("train", "--objective", "toy_objective:make", "--mesh", "data=1", "--batch-size", "16",
                     "--data", data, "--out", run, "--steps", "8", "--save-every", "2", "--resume",
                     env={"PYTHONPATH": str(TESTS)})
    assert_user_error(result, data, 'the data position saved with the checkpoint ({"epoch": 5})')


def rotate_out(run: Path, step: int) -> None:
    """What orbax does to a step a trainer with --keep rotates out: empties it item by item, then
    removes the directory (here 0.1 s later, from another thread)."""
    import shutil
    import threading

    step_dir = run / "checkpoints" / str(step)
    for item in ("config", "data"):
        shutil.rmtree(step_dir / item)
    threading.Timer(0.1, shutil.rmtree, args=(step_dir,)).start()


def test_a_reader_follows_a_checkpoint_rotated_out_while_it_reads_it(run, monkeypatch):
    import shutil

    from jepa_cli.training import checkpoint
    from jepa_cli.training.run import load_run

    held = run.parent / "held"
    shutil.move(run / "checkpoints" / "6", held)  # the trainer is still writing step 6
    real = checkpoint.digest_problem

    def rotate_while_reading(step_dir):
        problem = real(step_dir)
        if Path(step_dir).name == "4" and held.exists():  # keep 1: step 6 lands, step 4 goes
            shutil.move(held, run / "checkpoints" / "6")
            rotate_out(run, 4)
        return problem

    monkeypatch.setattr(checkpoint, "digest_problem", rotate_while_reading)
    messages = []
    _config, _objective, _host, step = load_run(run, on_fallback=lambda s, m: messages.append(m))
    assert (step, messages) == (6, [])


def test_a_step_asked_for_and_rotated_out_while_read_says_so(run, monkeypatch):
    from jepa_cli.errors import InputError
    from jepa_cli.training import checkpoint
    from jepa_cli.training.run import load_run

    real = checkpoint.digest_problem

    def rotate(step_dir):
        problem = real(step_dir)
        rotate_out(run, 4)
        return problem

    monkeypatch.setattr(checkpoint, "digest_problem", rotate)
    with pytest.raises(InputError, match="its checkpoint at step 4 was removed while it was read") as caught:
        load_run(run, step=4)
    assert "corrupt" not in str(caught.value)


# -- 12: embeddings that are not finite ---------------------------------------------------------------

def test_encode_latents_of_a_run_with_nan_weights_names_the_tensor_and_writes_nothing(run, run_cli, tmp_path,
                                                                                       monkeypatch):
    from test_encode import image_dataset

    from jepa_cli.training import run as runlib

    real = runlib.load_run

    def poisoned(*args, **kwargs):
        config, objective, host, step = real(*args, **kwargs)
        kernel = np.array(host["ema"]["kernel"])
        kernel[3, 5] = np.nan
        host["ema"]["kernel"] = kernel
        return config, objective, host, step

    monkeypatch.setattr(runlib, "load_run", poisoned)
    data = image_dataset(tmp_path / "data.zarr", n=6, size=8)
    out = tmp_path / "emb.zarr"
    assert_user_error(run_cli("encode-latents", run, data, "-o", out, "--mesh", "data=1"),
                      f"{run}: the target encoder at step 6 holds 1 non-finite value(s)", "['kernel']")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.zarr", "run"]


def test_embeddings_with_non_finite_rows_are_never_committed(tmp_path):
    from test_encode import image_dataset

    from jepa_cli.data import store
    from jepa_cli.errors import InputError
    from jepa_cli.evaluation.encode import encode_dataset

    data = image_dataset(tmp_path / "data.zarr", n=6, size=4)

    def encode(params, images):  # rows whose first pixel is above 128 come out as NaN
        import jax.numpy as jnp

        tokens = images.reshape(images.shape[0], 1, -1)
        return jnp.where(tokens[:, :, :1] > 128, jnp.nan, tokens)

    first = store.read_array(data / "inputs")[:, 0, 0, 0]
    with pytest.raises(InputError, match=f"RUN at step 3 gives non-finite embeddings \\(NaN or inf\\) for "
                                         f"{int((first > 128).sum())} of the 6 samples 0..5"):
        encode_dataset(data, tmp_path / "emb.zarr", encode, {}, batch_size=8, encoder_name="RUN at step 3")
    assert not (tmp_path / "emb.zarr").exists()


# -- the real CLI ----------------------------------------------------------------------------------

def test_import_of_strides_that_leave_the_storage_is_one_line_not_a_crash(tmp_path):
    from adversarial import expect_refusal

    def stride_out(checkpoint):
        tensor = checkpoint["encoder"]["module.pos_embed"]
        tensor.size, tensor.stride = (4, 4, 4), (4096, -100000, 1)

    (tmp_path / "in").mkdir()
    source = official_with(tmp_path / "in" / "strides.pth.tar", stride_out)
    expect_refusal("import-checkpoint", source, "-o", tmp_path / "out", *TINY, guard=[tmp_path],
                   fragments=[str(source), "a stride of a tensor on storage", "-100000"])


def test_encode_latents_of_a_step_with_a_flipped_byte_is_one_line_and_touches_nothing(run, tmp_path):
    from adversarial import expect_refusal
    from test_encode import image_dataset

    flip_a_byte(run, 6)
    data = image_dataset(tmp_path / "data.zarr", n=4, size=8)
    expect_refusal("encode-latents", run, data, "-o", tmp_path / "emb.zarr", "--step", "6", "--mesh", "data=1",
                   guard=[tmp_path], env={"PYTHONPATH": str(TESTS)},
                   fragments=["checkpoint at step 6 is unreadable, its files changed since it was saved",
                              "the newest intact checkpoint is step 4"])


# -- 10: the imported epoch ------------------------------------------------------------------------

@pytest.mark.parametrize("epoch, why", [(10**30, "is past the last step a run can hold (2,147,483,647"),
                                        (2**31 // 10 + 1, "x --ipe 10 is past the last step"), (True, "not a count of epochs"),
                                        (-1, "not a count of epochs"), ("3", "not a count of epochs")])
def test_import_of_an_absurd_epoch_is_one_line_and_writes_nothing(run_cli, tmp_path, epoch, why):
    def set_epoch(checkpoint):
        checkpoint["epoch"] = epoch

    (tmp_path / "in").mkdir()
    source = official_with(tmp_path / "in" / "epoch.pth.tar", set_epoch)
    out = tmp_path / "out"
    assert_user_error(run_cli("import-checkpoint", source, "-o", out, *TINY), str(source), why)
    assert not out.exists()


def test_import_of_a_state_dict_with_a_name_that_is_not_a_string_is_one_line(run_cli, tmp_path):
    def number_key(checkpoint):
        checkpoint["encoder"][1] = Tensor(np.zeros(3))

    (tmp_path / "in").mkdir()
    source = official_with(tmp_path / "in" / "key.pth.tar", number_key)
    assert_user_error(run_cli("import-checkpoint", source, "-o", tmp_path / "out", *TINY),
                      f"{source}: encoder is not a state dict of tensors")
    assert not (tmp_path / "out").exists()


def test_a_saved_config_that_builds_no_model_is_one_line_naming_the_step(run, run_cli):
    import json

    from jepa_cli.training.digest import DIGEST_FILE

    step_dir = run / "checkpoints" / "6"
    (step_dir / DIGEST_FILE).unlink()
    saved = json.loads((step_dir / "config" / "metadata").read_text())
    saved["lengths"] = {"steps": "six"}
    (step_dir / "config" / "metadata").write_text(json.dumps(saved))
    assert_user_error(run_cli("ema-inspect", run, "--step", "6"),
                      f"{run}: the configuration saved with its checkpoint at step 6 does not build a model (KeyError")


def test_a_full_disk_for_the_digest_leaves_the_committed_step_whole_and_no_temporary_file(tmp_path, monkeypatch):
    import jax

    from jepa_cli.data import files
    from jepa_cli.training import digest
    from jepa_cli.training.checkpoint import Checkpoints
    from jepa_cli.training.digest import DIGEST_FILE

    def full(path, data):  # the digest's write meets a full disk half way (the file size limit stands in for it)
        with file_size_limit(len(data) // 2):
            files.replace_file(path, data)

    state = {"params": {"w": np.arange(6, dtype=np.float32)}}
    ckpts = Checkpoints(tmp_path / "run", async_save=False)
    monkeypatch.setattr(digest, "replace_file", full)
    ckpts.save(1, state, {}, {})
    monkeypatch.undo()
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=jax.sharding.SingleDeviceSharding(
        jax.devices()[0])), state)
    restored, _data, _config = ckpts.restore(1, target)
    ckpts.close()
    step_dir = tmp_path / "run" / "checkpoints" / "1"
    assert not (step_dir / DIGEST_FILE).exists() and not list(step_dir.glob(f".{DIGEST_FILE}*"))
    np.testing.assert_array_equal(restored["params"]["w"], state["params"]["w"])


def test_a_stray_newer_step_directory_does_not_pass_for_a_rotation(run):
    from jepa_cli.training.run import load_run

    flip_a_byte(run, 6)
    (run / "checkpoints" / "0099").mkdir()  # a step name orbax does not list
    messages = []
    _config, _objective, _host, step = load_run(run, on_fallback=lambda s, m: messages.append(s))
    assert (step, messages) == (4, [6])
