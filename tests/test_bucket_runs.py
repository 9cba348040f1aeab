"""Training runs in a bucket (`--out s3://BUCKET/RUN`), against moto's S3 server on 127.0.0.1: the run
trains in a local mirror under its writer lease and uploads each committed checkpoint (files first,
its digest object last), run.json and metrics.jsonl; `--resume` continues from the newest committed step."""

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jepa_cli.errors import InputError
from jepa_cli.training.config import build_config
from jepa_cli.training.loop import train
from jepa_cli.training.run import load_run, params_sha256
from tests.conftest import assert_user_error
from tests.test_buckets import bucket, objects, s3_client, s3_server, staging  # noqa: F401 (fixtures)
from tests.test_training_loop import dataset  # noqa: F401 (fixture: 96 random 8x8 grey images)

ROOT = Path(__file__).resolve().parents[1]
TOY = "toy_objective:make"
STEPS = 8
# A trainer of the run in argv[2] on the dataset in argv[1]; argv[3]: the step after which it stops itself
# with SIGKILL (0: never), argv[4]: the step after which it prints "holding" and waits to be killed (0: never).
# Its saves are synchronous, so each checkpoint is committed in the bucket before the following update starts.
TRAINER = """
import os, signal, sys, time
from jepa_cli.training.config import build_config
from jepa_cli.training.loop import Callbacks, train
data, out, kill_at, hold_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def after_step(step):
    if step == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    if step == hold_at:
        print("holding", flush=True)
        time.sleep(600)
config = build_config(dict(objective="toy_objective:make", data=data, out=out, steps=8, batch_size=16, lr=1e-2,
                           warmup_steps=2, seed=3, save_every=2, async_checkpointing=False))
train(config, callbacks=Callbacks(after_step=after_step))
"""


def _cfg(dataset, out, **kw):
    values = dict(objective=TOY, data=str(dataset), out=str(out), steps=STEPS, batch_size=16, lr=1e-2,
                  warmup_steps=2, seed=3, save_every=2, async_checkpointing=True)
    values.update(kw)
    return build_config(values)


def _download(s3_server, bucket: str, key: str, folder: Path) -> Path:
    """Every object of the bucket run `key` copied with boto3 into `folder`, as a local run."""
    for name, data in objects(s3_server, bucket, f"{key}/").items():
        if name != ".jepa-lease":
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(data)
    return folder


def _params_sha(run: Path, step: int | None = None) -> str:
    _, _, host, _ = load_run(run, step)
    return params_sha256(host)


def _start_trainer(dataset, out: str, staging: Path, kill_at: int = 0, hold_at: int = 0) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(staging), "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    return subprocess.Popen([sys.executable, "-c", TRAINER, str(dataset), out, str(kill_at), str(hold_at)],
                            cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.slow
def test_a_run_trained_to_a_bucket_holds_the_checkpoint_a_local_run_holds(s3_server, bucket, dataset, tmp_path):
    local = train(_cfg(dataset, tmp_path / "local"))
    remote = train(_cfg(dataset, f"s3://{bucket}/runs/toy"))
    assert remote["run"] == f"s3://{bucket}/runs/toy" and remote["step"] == local["step"] == STEPS
    copy = _download(s3_server, bucket, "runs/toy", tmp_path / "copy")
    assert _params_sha(copy, STEPS) == _params_sha(tmp_path / "local", STEPS)
    assert [json.loads(line)["step"] for line in (copy / "metrics.jsonl").read_text().splitlines()] == \
        list(range(1, STEPS + 1))
    assert json.loads((copy / "run.json").read_text())["status"] == "finished"


@pytest.mark.slow
def test_every_checkpoint_in_the_bucket_has_its_files_before_its_digest_object(s3_server, bucket, dataset):
    train(_cfg(dataset, f"s3://{bucket}/run", keep=0))
    found = objects(s3_server, bucket, "run/")
    steps = sorted({int(k.split("/")[1]) for k in found if k.startswith("checkpoints/")})
    assert steps == [2, 4, 6, 8]
    for step in steps:
        digest = json.loads(found[f"checkpoints/{step}/jepa_digest.json"])
        assert {name: hashlib.sha256(found[f"checkpoints/{step}/{name}"]).hexdigest()
                for name in digest["files"]} == digest["files"]


@pytest.mark.slow
def test_a_checkpoints_digest_object_is_written_after_every_other_object_of_its_step_is_stored(
        s3_server, bucket, dataset, monkeypatch):
    from jepa_cli.data import buckets

    opened = buckets.open_store
    stored: list[str] = []  # the keys of the checkpoint objects, in the order their writes were done

    class Recorded:
        def __init__(self, url, real):
            self.url, self.real = url, real

        def __getattr__(self, name):
            return getattr(self.real, name)

        def write(self, key, value, **condition):
            future = self.real.write(key, value, **condition)
            if "/checkpoints/" in f"{self.url}/{key}/":
                future.add_done_callback(lambda _: stored.append(f"{self.url}/{key}".split("/checkpoints/")[1]))
            return future

    monkeypatch.setattr(buckets, "open_store", lambda url: Recorded(url, opened(url)))
    train(_cfg(dataset, f"s3://{bucket}/run", keep=0, async_checkpointing=False))
    for step in (2, 4, 6, 8):
        of_step = [key for key in stored if key.startswith(f"{step}/")]
        assert len(of_step) > 1 and of_step[-1] == f"{step}/jepa_digest.json" and of_step.count(of_step[-1]) == 1


@pytest.mark.slow
def test_a_bucket_run_keeps_the_checkpoints_keep_says(s3_server, bucket, dataset):
    train(_cfg(dataset, f"s3://{bucket}/run", keep=2))
    found = objects(s3_server, bucket, "run/")
    assert sorted({int(k.split("/")[1]) for k in found if k.startswith("checkpoints/")}) == [6, 8]


@pytest.mark.slow
def test_a_bucket_run_killed_then_resumed_holds_the_params_of_an_uninterrupted_one(run_cli, s3_server, bucket,
                                                                                   dataset, staging, tmp_path):
    train(_cfg(dataset, tmp_path / "full"))
    url = f"s3://{bucket}/run"
    killed = _start_trainer(dataset, url, staging, kill_at=5)
    killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL
    committed = {k for k in objects(s3_server, bucket, "run/") if k.endswith("/jepa_digest.json")}
    assert committed == {"checkpoints/2/jepa_digest.json", "checkpoints/4/jepa_digest.json"}  # before the kill
    _expire_lease(s3_server, bucket, "run")
    resumed = run_cli("train", "--out", url, "--resume", "--json")  # the rest of the configuration: run.json's
    assert resumed.exit_code == 0, resumed.stderr
    assert f"run {url}: steps 4 -> {STEPS}" in resumed.stderr
    assert json.loads(resumed.stdout)["step"] == STEPS
    copy = _download(s3_server, bucket, "run", tmp_path / "copy")
    assert _params_sha(copy, STEPS) == _params_sha(tmp_path / "full", STEPS)
    assert [json.loads(line)["step"] for line in (copy / "metrics.jsonl").read_text().splitlines()] == \
        list(range(1, STEPS + 1))


def _expire_lease(s3_server, bucket: str, key: str) -> None:
    """Moves the expiry of the lease a killed trainer left on `key` into the past, as a minute's wait would."""
    lease = json.loads(objects(s3_server, bucket, f"{key}/")[".jepa-lease"])
    lease["expires"] = 1.0
    s3_client(s3_server["endpoint"], s3_server["key"], s3_server["secret"]).put_object(
        Bucket=bucket, Key=f"{key}/.jepa-lease", Body=json.dumps(lease).encode())


@pytest.mark.slow
def test_a_second_trainer_of_a_bucket_run_is_refused_naming_the_first(run_cli, s3_server, bucket, dataset, staging):
    url = f"s3://{bucket}/run"
    first = _start_trainer(dataset, url, staging, hold_at=1)
    try:
        assert first.stdout.readline().strip() == "holding", first.stderr.read()
        second = run_cli("train", "--objective", TOY, "--data", str(dataset), "--out", url, "--steps", "8",
                         "--batch-size", "16", "--resume")
        assert_user_error(second, f"{url}: another process (", f":{first.pid}) is training in this run")
    finally:
        first.kill()
        first.wait()


@pytest.mark.slow
def test_a_new_run_over_a_bucket_run_with_checkpoints_is_refused_and_leaves_it_whole(s3_server, bucket, dataset):
    url = f"s3://{bucket}/run"
    train(_cfg(dataset, url, steps=2))
    before = objects(s3_server, bucket, "run/")
    with pytest.raises(InputError, match=f"^{url}: already holds a run \\(use --resume to continue it or --force"):
        train(_cfg(dataset, url, steps=2))
    assert objects(s3_server, bucket, "run/") == before


@pytest.mark.slow
def test_a_run_over_a_bucket_prefix_that_is_not_a_run_is_refused_and_leaves_it_whole(s3_server, bucket, dataset):
    client = s3_client(s3_server["endpoint"], s3_server["key"], s3_server["secret"])
    client.put_object(Bucket=bucket, Key="data.zarr/zarr.json", Body=b"{}")
    url = f"s3://{bucket}/data.zarr"
    with pytest.raises(InputError, match=f"^{url}: holds objects and is not a training run"):
        train(_cfg(dataset, url, steps=2), force=True)
    assert objects(s3_server, bucket, "data.zarr/") == {"zarr.json": b"{}"}


@pytest.mark.slow
def test_a_forced_bucket_run_replaces_the_checkpoints_of_the_old_one(s3_server, bucket, dataset):
    url = f"s3://{bucket}/run"
    train(_cfg(dataset, url, steps=4, keep=0))
    train(_cfg(dataset, url, steps=2, keep=0), force=True)
    found = objects(s3_server, bucket, "run/")
    assert sorted({int(k.split("/")[1]) for k in found if k.startswith("checkpoints/")}) == [2]


READ_ONLY_LOCALLY = "this command reads runs in a local folder only"


@pytest.mark.parametrize("args", [("ema-inspect", "s3://bkt/run"), ("runs", "s3://bkt/run"),
                                  ("plot", "s3://bkt/run", "-o", "curves.png")])
def test_a_command_that_reads_runs_refuses_a_bucket_run_in_one_line(run_cli, tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    assert_user_error(run_cli(*args), f"s3://bkt/run: {READ_ONLY_LOCALLY}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_info_of_a_bucket_run_refuses_in_one_line(run_cli, s3_server, bucket, dataset):
    train(_cfg(dataset, f"s3://{bucket}/run", steps=2))
    assert_user_error(run_cli("info", f"s3://{bucket}/run"), f"s3://{bucket}/run: {READ_ONLY_LOCALLY}")


# -- commands that read a bucket run through a local copy ---------------------------------------------------

RECIPE = ROOT / "jepa_cli" / "recipes" / "ijepa-digits-tiny.toml"
PLACES = ("train", "test", "encoder", "seconds")  # where each artifact lives, and the time: the rest must be equal


def _chain(run_cli, where: str) -> dict:
    """ingest -> train -> encode-latents -> probe knn with every artifact under `where` (a folder or a
    bucket prefix, ending in '/'); the probe's --json result."""
    for side in ("train", "test"):
        result = run_cli("ingest", "builtin:digits", f"{where}{side}.zarr", "--split", side, "--size", "16x16", "-q")
        assert result.exit_code == 0, result.stderr
    result = run_cli("train", "--config", RECIPE, "--data", f"{where}train.zarr", "--out", f"{where}run", "--steps",
                     "2", "--batch-size", "8", "--mesh", "data=1", "-q")
    assert result.exit_code == 0, result.stderr
    for side in ("train", "test"):
        result = run_cli("encode-latents", f"{where}run", f"{where}{side}.zarr", "-o", f"{where}emb-{side}.zarr",
                         "--mesh", "data=1", "-q")
        assert result.exit_code == 0, result.stderr
    result = run_cli("probe", "knn", f"{where}emb-train.zarr", f"{where}emb-test.zarr", "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.slow
def test_the_chain_with_every_artifact_in_a_bucket_prints_the_probe_table_of_local_files(run_cli, s3_server, bucket,
                                                                                         tmp_path):
    local = _chain(run_cli, f"{tmp_path}/")
    remote = _chain(run_cli, f"s3://{bucket}/")
    assert "checkpoints/2/jepa_digest.json" in objects(s3_server, bucket, "run/")  # the run was read from the bucket
    assert {k: v for k, v in remote.items() if k not in PLACES} == {k: v for k, v in local.items() if k not in PLACES}
    assert remote["top1"] == local["top1"] and 0.0 < local["top1"] <= 1.0
    # the embeddings record the bucket run and dataset they came from, not a local copy
    assert remote["encoder"]["run"] == f"s3://{bucket}/run"
    assert remote["encoder"]["source"] == f"s3://{bucket}/train.zarr"
    assert {k: v for k, v in remote["encoder"].items() if k not in ("run", "source")} == \
        {k: v for k, v in local["encoder"].items() if k not in ("run", "source")}


@pytest.mark.slow
def test_probe_run_of_a_bucket_run_gives_the_rows_of_its_local_copy(run_cli, s3_server, bucket, tmp_path):
    for side in ("train", "test"):
        result = run_cli("ingest", "builtin:digits", tmp_path / f"{side}.zarr", "--split", side, "--size", "16x16",
                         "-q")
        assert result.exit_code == 0, result.stderr
    url = f"s3://{bucket}/run"
    result = run_cli("train", "--config", RECIPE, "--data", tmp_path / "train.zarr", "--out", url, "--steps", "2",
                     "--batch-size", "8", "--mesh", "data=1", "--save-every", "1", "-q")
    assert result.exit_code == 0, result.stderr
    copy = _download(s3_server, bucket, "run", tmp_path / "copy")  # with boto3, every object
    tables = {}
    for run in (url, copy):
        result = run_cli("probe", "knn", tmp_path / "train.zarr", tmp_path / "test.zarr", "--run", run, "--step",
                         "all", "--json")
        assert result.exit_code == 0, result.stderr
        tables[str(run)] = json.loads(result.stdout)
    committed = sorted(int(key.split("/")[1]) for key in objects(s3_server, bucket, "run/")
                       if key.endswith("/jepa_digest.json"))
    assert tables[url]["run"] == url and [row["step"] for row in tables[url]["results"]] == committed
    assert committed[-2:] == [1, 2]
    assert tables[url]["results"] == tables[str(copy)]["results"]


def _fake_run(s3_server, bucket: str, found: dict[str, bytes]) -> str:
    """A bucket run `run` of the objects `found` (key relative to it -> bytes), put with boto3; its URL."""
    client = s3_client(s3_server["endpoint"], s3_server["key"], s3_server["secret"])
    for key, data in found.items():
        client.put_object(Bucket=bucket, Key=f"run/{key}", Body=data)
    return f"s3://{bucket}/run"


def test_a_step_a_bucket_run_has_not_committed_is_refused_naming_the_url_and_its_steps(run_cli, s3_server, bucket,
                                                                                       tmp_path):
    url = _fake_run(s3_server, bucket, {"run.json": b"{}", "checkpoints/2/jepa_digest.json": b"{}",
                                        "checkpoints/4/state": b"x"})  # step 4 has no digest: not committed
    result = run_cli("probe", "knn", tmp_path / "train.zarr", tmp_path / "test.zarr", "--run", url, "--step", "4")
    assert_user_error(result, f"{url}: no checkpoint at step 4 (checkpoints: 2)")


def test_a_bucket_prefix_without_run_json_is_not_a_run_to_probe(run_cli, s3_server, bucket, tmp_path):
    url = _fake_run(s3_server, bucket, {"checkpoints/2/jepa_digest.json": b"{}"})
    result = run_cli("probe", "knn", tmp_path / "train.zarr", tmp_path / "test.zarr", "--run", url)
    assert_user_error(result, f"{url}: not a training run (no run.json)")


def test_a_damaged_run_json_of_a_bucket_run_is_named_by_its_url_not_the_local_copy(run_cli, s3_server, bucket,
                                                                                   tmp_path, staging):
    url = _fake_run(s3_server, bucket, {"run.json": b"{not json", "checkpoints/2/jepa_digest.json": b"{}"})
    result = run_cli("probe", "knn", tmp_path / "train.zarr", tmp_path / "test.zarr", "--run", url)
    assert_user_error(result, f"{url}/run.json: damaged")
    assert str(staging) not in result.stderr
    assert [p for p in (staging / "jepa-staging").rglob("*") if p.is_file()] == []  # the copy is removed
