"""Hostile-user cases for `jepa import-checkpoint` and `jepa export`: crafted official checkpoints
(a pickle nested to crash the reader, stray or oddly numbered blocks, options that contradict the
file), runs the official model cannot stand for, and outputs that cannot be written. Each case runs
the real CLI (tests/adversarial.py) and expects one `jepa: error:` line.

Crafted files are the tiny official checkpoints of tests/data, read and written again without
torch (models/torch_writer.py) after a change, or a hand-made pickle in torch.save's zip layout."""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from adversarial import assert_one_error_line, expect_refusal, jepa_env, run_jepa, snapshot

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data"
IJEPA = DATA / "official_ijepa_tiny.pth.tar"
VJEPA = DATA / "official_vjepa_tiny.pth.tar"
AUDIO = DATA / "official_audio_jepa_tiny.ckpt"
# the options the tiny official files import with (tests/test_import_checkpoint*.py)
# (I-JEPA's crop, 32 px, left to each case)
IJEPA_TINY = ["--model", "tiny", "--width", "64", "--depth", "2", "--heads", "4", "--patch-size", "4",
              "--pred-width", "32", "--pred-depth", "2", "--pred-heads", "4"]
VJEPA_TINY = ["--heads", "2", "--num-frames", "4"]
AUDIO_TINY = ["--heads", "2", "--pred-heads", "2", "--mel-bins", "16"]
TIMEOUT = 120


def torch_zip(path: Path, pickled: bytes) -> Path:
    """`pickled` as the data.pkl of a torch.save zip archive (compressed, as a crafted file may be)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", pickled)
        archive.writestr("archive/byteorder", "little")
    return path


def rewritten(source: Path, path: Path, change) -> Path:
    """The official checkpoint `source` (its parts and counters), written again at `path` after
    change(checkpoint): a V-JEPA dict of parts, or an Audio-JEPA {epoch, global_step, state_dict}."""
    from jepa_cli.models.torch_checkpoint import read_torch_checkpoint
    from jepa_cli.models.torch_writer import torch_checkpoint_bytes

    lightning = source.suffix == ".ckpt"
    full = read_torch_checkpoint(source, keys=("state_dict",) if lightning else None, inert=lightning)
    keep = ("epoch", "global_step", "state_dict") if lightning else ("encoder", "predictor", "target_encoder", "epoch")
    checkpoint = {k: full[k] for k in keep}
    change(checkpoint)
    path.write_bytes(torch_checkpoint_bytes(checkpoint))
    return path


# -- the pickle ------------------------------------------------------------------------------------

def test_a_dict_key_nested_200000_tuples_deep_is_one_line_not_a_crash(tmp_path):
    # protocol 2: {} then the key 0 wrapped in 200,000 one-tuples, the value 1, SETITEM
    source = torch_zip(tmp_path / "deep.pth.tar", b"\x80\x02}K\x00" + b"\x85" * 200_000 + b"K\x01s.")
    expect_refusal("import-checkpoint", source, "-o", tmp_path / "out", guard=[tmp_path],
                   fragments=[str(source), "nests containers more than"], timeout=TIMEOUT)


# -- block numbers ---------------------------------------------------------------------------------

@pytest.mark.parametrize("source, key", [
    (VJEPA, "module.backbone.blocks.999999999.norm1.weight"),
    (AUDIO, "encoder.blocks.999999999.norm1.weight"),
], ids=["vjepa", "audio"])
def test_a_stray_block_far_past_the_last_is_refused_before_the_model_is_built(tmp_path, source, key):
    def add(checkpoint):
        part = checkpoint["state_dict"] if "state_dict" in checkpoint else checkpoint["encoder"]
        part[key] = np.ones(16, np.float32)

    crafted = rewritten(source, tmp_path / ("stray" + "".join(source.suffixes)), add)
    options = AUDIO_TINY if source == AUDIO else VJEPA_TINY
    expect_refusal("import-checkpoint", crafted, "-o", tmp_path / "out", *options, guard=[tmp_path],
                   fragments=[str(crafted), "blocks.999999999.norm1.weight", "but no blocks.2."], timeout=TIMEOUT)


def test_a_block_numbered_with_a_unicode_digit_is_refused_naming_the_key(tmp_path):
    def rename(checkpoint):
        part = checkpoint["state_dict"]
        part["encoder.blocks.\u00b2.norm1.weight"] = part.pop("encoder.blocks.1.norm1.weight")

    crafted = rewritten(AUDIO, tmp_path / "digit.ckpt", rename)
    expect_refusal("import-checkpoint", crafted, "-o", tmp_path / "out", *AUDIO_TINY, guard=[tmp_path],
                   fragments=[str(crafted), "blocks.\u00b2.norm1.weight"], timeout=TIMEOUT)


# -- the grid ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("source, options", [
    (VJEPA, [*VJEPA_TINY, "--image-size", "32"]),  # the file's 32 positions: 2 tubelets x 4 x 4 patches of 4 px
    (IJEPA, [*IJEPA_TINY, "--image-size", "1000000"]),  # the file's 64 positions: 8 x 8 patches of 4 px
], ids=["vjepa", "ijepa"])
def test_an_image_size_that_contradicts_the_files_position_table_is_refused(tmp_path, source, options):
    expect_refusal("import-checkpoint", source, "-o", tmp_path / "out", *options, guard=[tmp_path],
                   fragments=[str(source), "pos_embed", "--image-size"], timeout=TIMEOUT)


def test_an_audio_grid_of_no_release_is_not_guessed_without_mel_bins(tmp_path):
    # 32 positions in patches of 8: 16 frames x 128 mel bins, or 64 x 32, or ...: the file does not say
    def widen(checkpoint):
        state = checkpoint["state_dict"]
        for name in ("encoder.pos_embed", "target_encoder.pos_embed", "predictor.predictor_pos_embed"):
            state[name] = np.zeros((1, 32, state[name].shape[-1]), np.float32)

    crafted = rewritten(AUDIO, tmp_path / "grid.ckpt", widen)
    expect_refusal("import-checkpoint", crafted, "-o", tmp_path / "out", "--heads", "2", "--pred-heads", "2",
                   guard=[tmp_path], fragments=[str(crafted), "give --mel-bins"], timeout=TIMEOUT)


# -- what export writes --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ijepa_run(tmp_path_factory) -> Path:
    """The official tiny I-JEPA checkpoint, imported."""
    run = tmp_path_factory.mktemp("ijepa") / "run"
    result = run_jepa("import-checkpoint", IJEPA, "-o", run, *IJEPA_TINY, "--image-size", "32", "-q", timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    return run


def test_an_audio_run_trained_with_spec_norm_is_not_exported_as_official_weights(tmp_path, run_cli):
    from test_export import _train_step0

    run = _train_step0(tmp_path, "audio-jepa", 'spec_norm = "clip"\n')
    expect_refusal("export", run, "-o", tmp_path / "out.ckpt", "--all", guard=[tmp_path],
                   fragments=[str(run), "spec_norm 'clip'", "official Audio-JEPA front end"], timeout=TIMEOUT)


def test_an_output_where_no_file_can_be_made_is_named_as_given(ijepa_run):
    line = expect_refusal("export", ijepa_run, "-o", "/proc/x.safetensors", guard=[ijepa_run],
                          fragments=["/proc/x.safetensors: cannot write a file in /proc"], timeout=TIMEOUT)
    assert ".partial" not in line


def test_the_losing_one_of_two_concurrent_exports_suggests_no_force(ijepa_run, tmp_path, run_cli, monkeypatch):
    from jepa_cli.data import atomic

    out, rename = tmp_path / "w.safetensors", atomic.rename_no_replace

    def other_export_finishes_first(src, dst):  # between the existence check and the move
        if Path(dst) == out:
            out.write_bytes(b"the other export")
        rename(src, dst)

    monkeypatch.setattr(atomic, "rename_no_replace", other_export_finishes_first)
    result = run_cli("export", ijepa_run, "-o", out)
    assert result.exit_code == 2 and "another process wrote it" in result.stderr, (result.exit_code, result.stderr)
    assert "--force" not in result.stderr
    assert out.read_bytes() == b"the other export"


def test_import_onto_an_existing_path_suggests_no_force(ijepa_run):
    line = expect_refusal("import-checkpoint", IJEPA, "-o", ijepa_run, *IJEPA_TINY, "--image-size", "32",
                          guard=[ijepa_run], fragments=[f"{ijepa_run}: already exists"], timeout=TIMEOUT)
    assert "--force" not in line


def test_a_one_channel_ijepa_checkpoint_imports_as_a_one_channel_run(tmp_path):
    def one_channel(checkpoint):
        for part in ("encoder", "target_encoder"):
            weight = checkpoint[part]["module.patch_embed.proj.weight"]  # [D, C, p, p]
            checkpoint[part]["module.patch_embed.proj.weight"] = np.ascontiguousarray(weight[:, :1])

    source = rewritten(IJEPA, tmp_path / "gray.pth.tar", one_channel)
    result = run_jepa("import-checkpoint", source, "-o", tmp_path / "run", *IJEPA_TINY, "--image-size", "32", "-q",
                      timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "run" / "run.json").read_text())["config"]["objective_config"]["channels"] == 1


# -- a full disk ------------------------------------------------------------------------------------

def test_import_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    def at_most_200_kib():  # as a full disk: writes past 200 KiB fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (200 * 1024, 200 * 1024))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    out = tmp_path / "out"
    before = snapshot([tmp_path])
    result = subprocess.run([sys.executable, "-m", "jepa_cli", "import-checkpoint", IJEPA, "-o", out, *IJEPA_TINY,
                             "--image-size", "32"], env=jepa_env(), capture_output=True, timeout=TIMEOUT,
                            preexec_fn=at_most_200_kib)
    assert_one_error_line(result, fragments=[f"{out}: file too large", "nothing written"])
    assert snapshot([tmp_path]) == before
