"""`jepa import-checkpoint`: a published I-JEPA checkpoint (torch.save, official layout) as a run.

tests/data/official_ijepa_tiny.pth.tar was written by real `torch.save` (tests/data/
make_official_checkpoint.py) from the official code's golden weights (tests/data/golden/), in the
layout of facebookresearch/ijepa's save_checkpoint(): `module.`-prefixed encoder / predictor /
target_encoder state dicts, opt, scaler, epoch 3. No torch is needed to read it.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_user_error
from test_encode import image_dataset

DATA = Path(__file__).parent / "data"
CHECKPOINT = DATA / "official_ijepa_tiny.pth.tar"
GOLDEN = DATA / "golden" / "ijepa_forward_backward.npz"
# the golden model: VisionTransformer(img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=4), predictor 32 x 2
TINY = ["--model", "tiny", "--width", "64", "--depth", "2", "--heads", "4", "--patch-size", "4", "--image-size", "32",
        "--pred-width", "32", "--pred-depth", "2", "--pred-heads", "4", "--ipe", "10", "--epochs", "20"]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    from click.testing import CliRunner

    from jepa_cli.cli.main import cli

    run = tmp_path_factory.mktemp("import") / "run"
    result = CliRunner().invoke(cli, ["import-checkpoint", str(CHECKPOINT), "-o", str(run), *TINY, "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return run, json.loads(result.stdout)


@pytest.mark.slow
def test_the_imported_step_is_the_official_epoch_times_iterations_per_epoch(imported):
    run, summary = imported
    assert (summary["epoch"], summary["step"]) == (3, 30)
    assert [p.name for p in (run / "checkpoints").iterdir() if p.name.isdigit()] == ["30"]


@pytest.mark.slow
def test_run_json_names_the_source_file_and_its_sha256(imported):
    import hashlib

    run, _ = imported
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "imported"
    assert record["imported"]["source"] == CHECKPOINT.name
    assert record["imported"]["sha256"] == hashlib.sha256(CHECKPOINT.read_bytes()).hexdigest()
    assert record["config"]["objective_config"]["pred_width"] == 32


@pytest.mark.slow
def test_imported_target_encoder_features_equal_the_official_ones(imported):
    from jepa_cli.training.run import load_run

    run, _ = imported
    _config, objective, host, step = load_run(run)
    golden = np.load(GOLDEN)
    images = golden["imgs"].transpose(0, 2, 3, 1)  # NCHW -> NHWC
    h_full = objective.encoder(host["ema"])(images)  # [3, 64, 64]
    np.testing.assert_allclose(np.asarray(h_full), golden["h_full"], atol=1e-5)
    np.testing.assert_array_equal(host["params"]["encoder"]["patch_embed"]["kernel"].shape, (4, 4, 3, 64))


@pytest.mark.slow
def test_imported_context_encoder_is_the_official_encoder_not_the_target(imported):
    from jepa_cli.training.run import load_run

    run, _ = imported
    _config, _objective, host, _step = load_run(run)
    golden = np.load(GOLDEN)
    official_enc, official_tgt = golden["enc/blocks.0.attn.qkv.weight"], golden["tgt/blocks.0.attn.qkv.weight"]
    assert not np.array_equal(official_enc, official_tgt)
    kernel = host["params"]["encoder"]["blocks"]
    ema_kernel = host["ema"]["blocks"]
    assert not all(np.array_equal(a, b) for a, b in zip(_leaves(kernel), _leaves(ema_kernel)))


def _leaves(tree):
    import jax

    return jax.tree.leaves(tree)


@pytest.mark.slow
def test_ema_inspect_reads_the_imported_run(imported, run_cli):
    run, _ = imported
    result = run_cli("ema-inspect", run, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["step"] == 30


@pytest.mark.slow
def test_encode_latents_reads_the_imported_run(imported, run_cli, tmp_path):
    run, _ = imported
    data = image_dataset(tmp_path / "data.zarr", n=6, size=32, channels=3)
    result = run_cli("encode-latents", run, data, "-o", tmp_path / "emb.zarr", "--batch-size", "8", "--mesh", "data=1",
                     "-q", "--json")
    assert result.exit_code == 0, result.stderr
    from jepa_cli.data import store

    assert store.open_array(tmp_path / "emb.zarr" / "inputs").shape == (6, 64)


@pytest.mark.slow
def test_an_existing_output_is_refused_and_left_alone(imported, run_cli):
    run, _ = imported
    before = (run / "run.json").read_bytes()
    assert_user_error(run_cli("import-checkpoint", CHECKPOINT, "-o", run, *TINY), str(run))
    assert (run / "run.json").read_bytes() == before


@pytest.mark.slow
def test_a_checkpoint_of_another_model_is_one_line_and_writes_nothing(run_cli, tmp_path):
    wrong = [*TINY]
    wrong[wrong.index("--pred-width") + 1] = "48"
    out = tmp_path / "run"
    assert_user_error(run_cli("import-checkpoint", CHECKPOINT, "-o", out, *wrong), "predictor", "--model")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_default_vith14_model_rejects_a_tiny_checkpoint(run_cli, tmp_path):
    assert_user_error(run_cli("import-checkpoint", CHECKPOINT, "-o", tmp_path / "run"), "encoder")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["missing", "truncated", "not-zip", "empty"])
def test_a_missing_or_damaged_file_is_one_line_and_writes_nothing(run_cli, tmp_path, damage):
    source = tmp_path / "in" / "ckpt.pth.tar"
    source.parent.mkdir()
    if damage == "truncated":
        source.write_bytes(CHECKPOINT.read_bytes()[: CHECKPOINT.stat().st_size // 2])
    elif damage == "not-zip":
        source.write_text("encoder: not a checkpoint\n")
    elif damage == "empty":
        source.write_bytes(b"")
    out = tmp_path / "out" / "run"
    assert_user_error(run_cli("import-checkpoint", source, "-o", out, *TINY), str(source))
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


@pytest.mark.slow
def test_a_pickle_that_needs_another_class_is_refused_before_it_runs(tmp_path):
    from jepa_cli.errors import InputError
    from jepa_cli.models.torch_checkpoint import read_torch_checkpoint

    # protocol-2 pickle of os.system("true"): GLOBAL 'posix system', a tuple argument, REDUCE
    payload = b"\x80\x02cposix\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03."
    path = tmp_path / "evil.pth.tar"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", payload)
    with pytest.raises(InputError, match="posix.system"):
        read_torch_checkpoint(path)


@pytest.mark.slow
def test_a_zip_without_data_pkl_is_not_a_torch_checkpoint(tmp_path):
    from jepa_cli.errors import InputError
    from jepa_cli.models.torch_checkpoint import read_torch_checkpoint

    path = tmp_path / "other.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("readme.txt", "hello")
    with pytest.raises(InputError, match="data.pkl"):
        read_torch_checkpoint(path)


def test_the_reader_returns_what_torch_saved():
    from jepa_cli.models.torch_checkpoint import read_torch_checkpoint

    checkpoint = read_torch_checkpoint(CHECKPOINT)
    golden = np.load(GOLDEN)
    assert checkpoint["epoch"] == 3 and checkpoint["world_size"] == 16 and checkpoint["scaler"] is None
    weight = checkpoint["encoder"]["module.blocks.1.mlp.fc2.weight"]
    assert weight.dtype == np.float32 and weight.flags.c_contiguous
    np.testing.assert_array_equal(weight, golden["enc/blocks.1.mlp.fc2.weight"])


def test_strided_and_shared_storages_read_like_torch_does():
    """tests/data/torch_layouts.pt (tests/data/make_torch_layouts.py): views of one storage at their
    own offsets and strides, and every dtype torch names, as torch wrote them."""
    from jepa_cli.models.torch_checkpoint import read_torch_checkpoint

    got = read_torch_checkpoint(DATA / "torch_layouts.pt")
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    want = {"t": base.T, "slice": base[1:3, 2:5], "same": base, "half": base.astype(np.float16),
            "long": np.arange(3, dtype=np.int64), "scalar": np.array(2.5, np.float32), "param": np.ones(2, np.float32),
            "bf16": base}
    dtypes = {"half": "float16", "long": "int64", "bf16": "bfloat16"}
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert str(got[key].dtype) == dtypes.get(key, "float32"), key
        np.testing.assert_array_equal(np.asarray(got[key], value.dtype), value, err_msg=key)


@pytest.mark.slow
def test_the_imported_checkpoint_carries_the_digest_of_its_files(imported):
    from jepa_cli.training.digest import DIGEST_FILE, digest_problem

    run, _ = imported
    step_dir = run / "checkpoints" / "30"
    record = json.loads((step_dir / DIGEST_FILE).read_text())
    assert any(name.startswith("state/") for name in record["files"])
    assert digest_problem(step_dir) is None


@pytest.mark.slow
def test_an_import_whose_checkpoint_does_not_read_back_as_written_fails_and_writes_nothing(run_cli, tmp_path,
                                                                                          monkeypatch):
    from jepa_cli.training import import_official

    monkeypatch.setattr(import_official, "digest_problem", lambda step_dir: "state/d/0 does not match its SHA-256")
    out = tmp_path / "run"
    result = run_cli("import-checkpoint", CHECKPOINT, "-o", out, *TINY)
    assert result.exit_code == 1, result.stderr
    assert result.stderr.splitlines() == [f"jepa: error: {out}: the imported checkpoint does not read back as written "
                                          "(state/d/0 does not match its SHA-256); nothing written"]
    assert list(tmp_path.iterdir()) == []
