"""`jepa train --objective ijepa` end to end on builtin:digits, `jepa info RUN`, `jepa ema-inspect`,
and bad input: one line, exit 2, RUN untouched."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import assert_user_error

from jepa_cli.data import store

TINY = ["--model", "tiny", "--patch-size", "4", "--pred-depth", "1", "--pred-width", "16", "--min-keep", "4"]
TINY_TOML = """
objective = "ijepa"
batch_size = 32
lr = 2e-3
warmup_steps = 4
log_every = 1
[ijepa]
depth = 2
width = 32
heads = 2
"""


def _cli(*args):
    from jepa_cli.cli.main import cli

    r = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False, prog_name="jepa")
    return r


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("ijepa")
    digits = root / "digits.zarr"
    r = _cli("ingest", "builtin:digits", digits, "--size", "16x16", "--channels", "1", "-q")
    assert r.exit_code == 0, r.stderr
    recipe = root / "tiny.toml"
    recipe.write_text(TINY_TOML)
    run = root / "run"
    r = _cli("train", "--config", recipe, "--data", digits, "--out", run, "--steps", "40", "--mesh", "data=2",
             "--save-every", "20", "--json", "-q", *TINY)
    assert r.exit_code == 0, r.stderr
    return {"root": root, "digits": digits, "recipe": recipe, "run": run, "result": json.loads(r.stdout)}


@pytest.mark.slow
def test_ijepa_loss_falls_on_digits(trained):
    result = trained["result"]
    assert result["run"] == str(trained["run"]) and result["step"] == 40
    lines = [json.loads(x) for x in (trained["run"] / "metrics.jsonl").read_text().splitlines()]
    losses = np.array([m["loss"] for m in lines])
    assert len(losses) == 40 and np.isfinite(losses).all()
    assert losses[-5:].mean() < 0.7 * losses[:5].mean()
    for key in ("lr", "weight_decay", "ema_momentum", "grad_norm", "repr_std", "repr_cov_offdiag", "examples_per_sec"):
        assert key in lines[-1]
    assert lines[-1]["repr_std"] > 0


@pytest.mark.slow
def test_info_and_ema_inspect(trained):
    r = _cli("info", trained["run"], "--json")
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["kind"] == "run" and info["objective"] == "ijepa" and info["model"] == "tiny"
    assert info["mixer"] == "attn" and "ssm_state" not in info  # attention only: no S5 options shown
    assert info["steps_done"] == 40 and info["checkpoints"] == [20, 40] and len(info["params_sha256"]) == 64
    assert info["latest_metrics"]["step"] == 40
    losses = [json.loads(x)["loss"] for x in (trained["run"] / "metrics.jsonl").read_text().splitlines()]
    curve = info["loss_curve"]  # 40 logged rows: one per bucket
    assert curve["steps"] == list(range(1, 41)) and curve["loss"] == pytest.approx(losses)
    assert (curve["first"], curve["last"]) == (losses[0], losses[-1])
    human = _cli("info", trained["run"]).stdout
    assert f"{losses[0]:.4f} -> {losses[-1]:.4f} (steps 1..40)" in human
    r = _cli("ema-inspect", trained["run"], "--json", "--at", "20")
    assert r.exit_code == 0, r.stderr
    ema = json.loads(r.stdout)
    assert ema["step"] == 40 and ema["total_steps"] == 40
    assert ema["momentum"] == pytest.approx(1.0) and ema["at"]["momentum"] == pytest.approx(0.998, abs=1e-6)
    names = {m["name"] for m in ema["modules"]}
    assert names and all(0 <= m["relative_distance"] < 1 and m["cosine"] > 0.5 for m in ema["modules"])
    r = _cli("ema-inspect", trained["run"])
    assert r.exit_code == 0 and "momentum" in r.stdout


def test_sparkline_maps_the_range_onto_eight_blocks():
    from jepa_cli.cli.common import sparkline

    assert sparkline([0.0, 0.5, 1.0, 0.25]) == "▁▅█▃"
    assert sparkline([2.0, 2.0]) == "▁▁"


def _snapshot(path):
    return sorted((str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*"))


@pytest.mark.slow
def test_bad_input_one_line_exit2_run_untouched(trained, tmp_path):
    digits, run, recipe = trained["digits"], trained["run"], trained["recipe"]
    before = _snapshot(run)
    audio = tmp_path / "audio.zarr"
    store.write_group(audio, store.base_attributes("dataset", modality="audio", layout="NT", class_names=[]))
    store.write_array(audio / "inputs", np.zeros((4, 8, 8, 1), np.uint8))
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("steps = 3\nlearnin_rate = 1.0\n")
    new = tmp_path / "new"
    base = ["train", "--config", recipe, "--steps", "2", *TINY]
    cases = [
        ([*base, "--data", tmp_path / "missing.zarr", "--out", new], ["missing.zarr"]),
        ([*base, "--data", audio, "--out", new], ["modality"]),
        ([*base, "--data", digits, "--out", new, "--image-size", "18"], ["not divisible by the patch size"]),
        ([*base, "--data", digits, "--out", new, "--batch-size", "30", "--mesh", "data=8"], ["30", "not divisible"]),
        ([*base, "--data", digits, "--out", new, "--mesh", "data=16"], ["16 devices"]),
        ([*base, "--data", digits, "--out", new, "--model", "enormous"], ["enormous"]),
        (["train", "--config", bad_toml, "--data", digits, "--out", new], ["learnin_rate"]),
        ([*base, "--data", digits, "--out", run], ["--resume", "--force"]),
        ([*base, "--data", digits, "--out", run, "--resume", "--steps", "50", "--pred-width", "24"], ["another model"]),
        ([*base, "--data", digits, "--out", run, "--resume", "--mesh", "data=16"], ["16 devices"]),
    ]
    for args, fragments in cases:
        r = _cli(*args)
        assert_user_error(r, *fragments)
        assert not new.exists()
        assert _snapshot(run) == before, args


@pytest.mark.slow
def test_print_config_is_the_recorded_configuration(trained, tmp_path):
    args = ["train", "--config", trained["recipe"], "--data", trained["digits"], "--out", trained["run"], "--steps",
            "40", "--mesh", "data=2", "--save-every", "20", *TINY, "--print-config"]
    r = _cli(*args)
    assert r.exit_code == 0, r.stderr
    printed = tmp_path / "printed.toml"
    printed.write_text(r.stdout)
    from jepa_cli.training.config import build_config, load_toml

    recorded = json.loads((trained["run"] / "run.json").read_text())["config"]
    recorded["objective_config"].pop("total_updates", None)  # recomputed from the length, as on --resume
    # TOML has no null: a None option is left out, and None is its default
    recorded["objective_config"] = {k: v for k, v in recorded["objective_config"].items() if v is not None}
    assert build_config(load_toml(printed)).to_dict() == recorded
    again = _cli("train", "--config", printed, "--print-config")  # a fixed point: the recipe resolves to itself
    assert again.exit_code == 0 and again.stdout == r.stdout


@pytest.mark.slow
def test_a_redirected_stderr_gets_one_plain_line_every_log_every_updates(resumed):
    import re

    lines = [line for line in resumed["stderr"].splitlines() if not line.startswith("jepa: warning: ")]
    assert lines[0].startswith(f"run {resumed['run']}: steps 40 -> 46")
    steps = [line for line in lines if line.startswith("step ")]
    assert [s.split()[1] for s in steps] == ["42/46", "45/46", "46/46"]
    pattern = r"step \d+/46 loss \d+\.\d{4} lr \d\.\d\de-\d\d [\d,]+ ex/s ETA \d+(m\d\d)?s"
    assert all(re.fullmatch(pattern, s) for s in steps), steps
    assert "\x1b" not in resumed["stderr"] and ".py:" not in resumed["stderr"]  # no colour codes, no rich source tags


@pytest.mark.slow
def test_plot_draws_the_runs_curves_once_and_refuses_what_it_cannot(trained, tmp_path):
    png = tmp_path / "curves.png"
    r = _cli("plot", trained["run"], trained["run"], "-o", png, "--json")
    assert r.exit_code == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["rows"] == {str(trained["run"]): 40} and result["metrics"][0] == "loss"
    first = png.read_bytes()
    assert first.startswith(b"\x89PNG")
    assert_user_error(_cli("plot", trained["run"], "-o", png), "already exists")
    assert png.read_bytes() == first
    assert _cli("plot", trained["run"], trained["run"], "-o", png, "--force").exit_code == 0
    assert png.read_bytes() == first  # the same run gives the same bytes
    assert_user_error(_cli("plot", trained["run"], "-o", tmp_path / "b.png", "--metrics", "loss,nope"), "nope")
    assert_user_error(_cli("plot", trained["digits"], "-o", tmp_path / "c.png"), "not a training run")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.png"]


def _tensorboard_scalars(directory) -> dict:
    """{(tag, step): value} from the TFRecord event files in `directory` (tensorboardX's protobufs)."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    out = {}
    for path in directory.glob("events.out.tfevents.*"):
        data = path.read_bytes()
        at = 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at:at + 8])
            event = Event.FromString(data[at + 12:at + 12 + length])  # after length and its crc
            at += 12 + length + 4  # and the data's crc
            for value in event.summary.value:
                out[(value.tag, event.step)] = value.simple_value
    return out


@pytest.mark.slow
def test_tensorboard_gets_the_rows_of_metrics_jsonl(resumed):
    rows = resumed["rows"]
    scalars = _tensorboard_scalars(resumed["board"])
    for row in rows:
        assert scalars[("loss", row["step"])] == pytest.approx(row["loss"], rel=1e-6)
        assert scalars[("lr", row["step"])] == pytest.approx(row["lr"], rel=1e-6)
    assert {step for _, step in scalars} == {42, 45, 46}


class _WandbDouble:
    """What jepa uses of the wandb module (init, then log and finish on its run), recorded."""

    def __init__(self):
        self.calls = []

    def init(self, **kwargs):
        self.calls.append(("init", kwargs))
        return self

    def log(self, data, step):
        self.calls.append(("log", dict(data), step))

    def finish(self):
        self.calls.append(("finish",))


@pytest.mark.slow
def test_pixels_normalised_on_the_device_train_as_the_input_pipeline_does(trained, tmp_path):
    import shutil

    from jepa_cli.training.run import load_run

    params = {}
    for name, extra in (("host", []), ("device", ["--device-normalise"])):
        run = tmp_path / name
        shutil.copytree(trained["run"], run)
        r = _cli("train", "--out", run, "--data", trained["digits"], "--resume", "--steps", "42", "-q", *extra)
        assert r.exit_code == 0, r.stderr
        _, _, params[name], step = load_run(run)
        assert step == 42
    # the inputs differ by at most one float32 rounding (XLA:CPU's division), so two updates agree to 1e-6
    for device, host in zip(jax.tree.leaves(params["device"]), jax.tree.leaves(params["host"])):
        np.testing.assert_allclose(device, host, rtol=0, atol=1e-6)
    config = json.loads((tmp_path / "device" / "run.json").read_text())["config"]
    assert config["device_normalise"] is True


def test_pixels_normalised_on_the_device_and_on_the_host_are_x_over_255_less_the_mean_over_the_std():
    from jepa_cli.data.transforms import random_resized_crop

    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    images = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 3), np.uint8)
    expected = (images / 255.0 - np.array(mean)) / np.array(std)  # float64, by hand
    device = random_resized_crop(8, mean, std, scale=(1.0, 1.0), ratio=(1.0, 1.0), on_device=True).device
    on_device = np.asarray(jax.jit(device)({"image": images})["image"])
    host = random_resized_crop(8, mean, std, scale=(1.0, 1.0), ratio=(1.0, 1.0))  # the whole image, not resized
    on_host = np.stack([host({"image": image}, np.random.default_rng(1))["image"] for image in images])
    assert on_device.dtype == on_host.dtype == np.float32
    np.testing.assert_allclose(on_device, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(on_host, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_device_normalise_is_refused_in_one_line_where_the_inputs_are_not_pixels(trained, tmp_path):
    r = _cli("train", "--objective", "flow", "--data", trained["digits"], "--out", tmp_path / "flow", "--steps", "1",
             "--device-normalise")
    assert_user_error(r, "--device-normalise: flow's inputs are not pixels")
    assert not (tmp_path / "flow").exists()
    four = tmp_path / "rgba.zarr"  # Pillow resizes 1 or 3 channels as uint8
    store.write_group(four, store.base_attributes("dataset", modality="image", layout="NHWC", class_names=[]))
    store.write_array(four / "inputs", np.zeros((16, 16, 16, 4), np.uint8))
    r = _cli("train", "--config", trained["recipe"], "--data", four, "--out", tmp_path / "rgba", "--steps", "1",
             "--batch-size", "8", *TINY, "--device-normalise")
    assert_user_error(r, "--device-normalise takes 1- or 3-channel pixels", "these have 4")
    assert not (tmp_path / "rgba").exists()


@pytest.fixture(scope="module")
def resumed(trained, tmp_path_factory):
    """One resume of the trained run, 40 -> 46 logging every 3 updates, to TensorBoard and to a recorded
    wandb, its stderr redirected: the three sinks' tests read this one training."""
    import shutil
    import sys

    root = tmp_path_factory.mktemp("resumed")
    run, board, wandb = root / "run", root / "board", _WandbDouble()
    shutil.copytree(trained["run"], run)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "wandb", wandb)
        r = _cli("train", "--out", run, "--data", trained["digits"], "--resume", "--steps", "46", "--log-every", "3",
                 "--tensorboard", board, "--wandb", "jepa-test")
    assert r.exit_code == 0, r.stderr
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][40:]
    assert [row["step"] for row in rows] == [42, 45, 46]
    return {"run": run, "board": board, "wandb": wandb.calls, "stderr": r.stderr, "rows": rows}


@pytest.mark.slow
def test_wandb_gets_the_rows_of_metrics_jsonl_at_their_steps(resumed):
    (_, init), *logged, finished = resumed["wandb"]
    assert (init["project"], init["name"], init["dir"]) == ("jepa-test", "run", str(resumed["run"]))
    assert init["config"]["wandb"] == "jepa-test" and init["config"]["objective"] == "ijepa"
    assert [step for _, _, step in logged] == [42, 45, 46] and finished == ("finish",)
    for (_, data, _), row in zip(logged, resumed["rows"], strict=True):
        assert data["loss"] == pytest.approx(row["loss"], rel=1e-6) and "step" not in data


@pytest.mark.slow
def test_wandb_without_its_package_is_refused_before_anything_is_written(trained, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # what an install without the extra sees
    run = tmp_path / "run"
    r = _cli("train", "--config", trained["recipe"], "--out", run, "--data", trained["digits"], "--steps", "1",
             "--wandb", "p")
    assert_user_error(r, "--wandb needs the wandb package: pip install 'jepa-cli[wandb]'")
    assert not run.exists()


@pytest.mark.slow
def test_plot_and_info_skip_metrics_lines_that_are_not_rows(trained, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained["run"], run)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('[1, 2]\n{"loss": 0.5}\n{"step": "7", "loss": 0.5}\n"text"\n{"step": 41, "loss": 0.1')  # cut short
    r = _cli("plot", run, "-o", tmp_path / "c.png", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["rows"] == {str(run): 40}
    info = json.loads(_cli("info", run, "--json").stdout)
    assert info["latest_metrics"]["step"] == 40 and len(info["loss_curve"]["steps"]) == 40
