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

from conftest import assert_user_error

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
    (-1, (4,), (1,), "storage offset"),  # read 3,642 values from before the storage
    (0, (2, 3, 4), (4096, -100000, 1), "stride"),  # segfaulted
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
                      "target_encoder tensor module.blocks.1.mlp.fc2.weight holds 2 non-finite value(s)")
    assert not out.exists()
