"""Datasets and embedding sets in a bucket (s3://), against a real S3 server on 127.0.0.1 (moto's).

The session's server authenticates: its first requests create an IAM user with a key that may do
anything, and every later request must be signed with that key. Each test gets a fresh bucket and the
AWS_* variables that point at the server.
"""

import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import assert_user_error, read_zarr

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "jepa_cli" / "recipes" / "ijepa-digits-tiny.toml"
UNSIGNED_REQUESTS = 3  # create_user, create_access_key, put_user_policy: the server checks every later one
ALLOW_ALL = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_answering(endpoint: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=1)
            return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def s3_client(endpoint: str, key: str, secret: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=key,
                        aws_secret_access_key=secret)


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server in a subprocess on a free port, with one IAM key; stopped after the session."""
    import boto3

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(UNSIGNED_REQUESTS)})
    try:
        wait_until_answering(endpoint)
        iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="setup",
                           aws_secret_access_key="setup")
        iam.create_user(UserName="jepa")
        key = iam.create_access_key(UserName="jepa")["AccessKey"]
        iam.put_user_policy(UserName="jepa", PolicyName="all", PolicyDocument=ALLOW_ALL)
        yield {"endpoint": endpoint, "key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}
    finally:
        process.terminate()
        process.wait(timeout=30)


def point_at(monkeypatch, endpoint: str, key: str, secret: str) -> None:
    """The variables a user sets for an S3-compatible server, and nothing else of the developer's."""
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("JEPA_BUCKET_RETRIES", "1")


@pytest.fixture
def staging(tmp_path, monkeypatch):
    """The temporary directory, where bucket outputs are staged: empty, to see what is left there."""
    folder = tmp_path / "tmpdir"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture
def bucket(s3_server, monkeypatch, staging):
    """A fresh bucket on the session's server, the environment pointing at it; its name."""
    name = f"b-{uuid.uuid4().hex[:12]}"
    client = s3_client(s3_server["endpoint"], s3_server["key"], s3_server["secret"])
    client.create_bucket(Bucket=name)
    point_at(monkeypatch, s3_server["endpoint"], s3_server["key"], s3_server["secret"])
    return name


def objects(s3_server, bucket: str, prefix: str = "") -> dict[str, bytes]:
    """Every object under `prefix` (key relative to it) and its bytes, read with boto3."""
    client = s3_client(s3_server["endpoint"], s3_server["key"], s3_server["secret"])
    found = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"][len(prefix):]: client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in found}


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def staged_entries(staging: Path) -> list[Path]:
    return list((staging / "jepa-staging").rglob("*")) if (staging / "jepa-staging").exists() else []


# -- URLs and the environment (no server) ---------------------------------------------------------------

@pytest.mark.parametrize("url, fragment", [
    ("http://host/data.zarr", "unsupported scheme http://"),
    ("ftp://host/data.zarr", "unsupported scheme ftp://"),
    ("s3://bkt/a/../data.zarr", "'..'"),
    ("s3:///data.zarr", "no bucket name"),
    ("s3:bkt/data.zarr", "malformed bucket URL"),
    ("s3://bkt", "needs a path inside the bucket"),
    ("s3://bkt/a//b", "empty segment"),
    ("s3://Bad_Bucket!/x", "not a valid bucket name"),
])
def test_a_url_the_toolkit_cannot_address_is_refused(url, fragment):
    from jepa_cli.data.urls import location
    from jepa_cli.errors import InputError

    with pytest.raises(InputError, match=None) as raised:
        location(url)
    assert fragment in str(raised.value) and "\n" not in str(raised.value)


def test_a_bucket_url_joins_names_like_a_path_and_prints_back():
    from jepa_cli.data.urls import location

    url = location("gs://my-bucket/sets/train.zarr/")
    assert (url.scheme, url.bucket, url.key) == ("gs", "my-bucket", "sets/train.zarr")
    assert str(url / "inputs") == "gs://my-bucket/sets/train.zarr/inputs"
    assert (url / "inputs").name == "inputs"


def test_a_local_path_stays_a_path():
    from jepa_cli.data.urls import location

    assert location("runs/a:b/data.zarr") == Path("runs/a:b/data.zarr")


def test_the_kvstore_spec_takes_endpoint_region_and_credentials_from_the_environment():
    from jepa_cli.data.urls import location

    environ = {"AWS_ENDPOINT_URL": "http://all", "AWS_ENDPOINT_URL_S3": "http://s3-only:9000",
               "AWS_DEFAULT_REGION": "eu-west-1", "AWS_REGION": "us-west-2", "AWS_ACCESS_KEY_ID": "k",
               "JEPA_BUCKET_RETRIES": "3"}
    assert location("s3://bkt/a/b.zarr").kvstore(environ) == {
        "driver": "s3", "bucket": "bkt", "path": "a/b.zarr/", "endpoint": "http://s3-only:9000",
        "aws_region": "us-west-2", "aws_credentials": {"type": "environment"}, "use_conditional_write": True,
        "context": {"s3_request_retries": {"max_retries": 3, "initial_delay": "0.5s", "max_delay": "8s"}}}
    assert location("s3://bkt/x").kvstore({"AWS_ENDPOINT_URL": "http://all", "AWS_DEFAULT_REGION": "eu-west-1"}) == {
        "driver": "s3", "bucket": "bkt", "path": "x/", "endpoint": "http://all", "aws_region": "eu-west-1",
        "use_conditional_write": True, "context": {"s3_request_retries": {"max_retries": 8, "initial_delay": "0.5s", "max_delay": "8s"}}}
    assert location("gs://bkt/x").kvstore({})["driver"] == "gcs"


def test_the_gs_spec_is_one_tensorstore_accepts():
    import tensorstore as ts

    from jepa_cli.data.urls import location

    spec = ts.KvStore.Spec(location("gs://my-bucket/sets/a.zarr").kvstore({})).to_json()
    assert (spec["driver"], spec["bucket"], spec["path"]) == ("gcs", "my-bucket", "sets/a.zarr/")


@pytest.mark.parametrize("output, relation", [("s3://bkt/sets/a.zarr", "is the input"),
                                              ("s3://bkt/sets/a.zarr/emb", "lies inside the input"),
                                              ("s3://bkt/sets", "contains the input")])
def test_a_bucket_output_that_overlaps_its_input_is_refused_before_the_store_is_asked(output, relation):
    from jepa_cli.data import atomic
    from jepa_cli.errors import InputError

    with pytest.raises(InputError) as raised:
        atomic.check_output(output, False, "dataset", ["s3://bkt/sets/a.zarr"])
    assert relation in str(raised.value)


def test_a_single_file_output_in_a_bucket_is_refused():
    from jepa_cli.data import atomic
    from jepa_cli.errors import InputError

    with pytest.raises(InputError, match="written to a local path only"):
        atomic.check_output_file("s3://bkt/grid.png", False, atomic.PNG_MAGIC, "PNG picture")


def test_env_says_which_bucket_variables_are_set_never_their_values(run_cli, monkeypatch):
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID",
                 "AWS_SESSION_TOKEN", "AWS_PROFILE", "GOOGLE_APPLICATION_CREDENTIALS", "JEPA_BUCKET_RETRIES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value")
    result = run_cli("env", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["bucket_variables"]["AWS_SECRET_ACCESS_KEY"] is True
    assert json.loads(result.stdout)["bucket_variables"]["AWS_ACCESS_KEY_ID"] is False
    human = run_cli("env")
    assert "AWS_SECRET_ACCESS_KEY" in human.stdout
    assert "s3cr3t-value" not in human.stdout + result.stdout


def test_a_run_at_a_malformed_bucket_url_is_refused_before_anything_is_written(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run_cli("train", "--config", RECIPE, "--data", "s3://bkt/data.zarr", "--out", "s3://bkt/a/../run",
                     "--steps", "1")
    assert_user_error(result, "s3://bkt/a/../run: a bucket path may not hold '.' or '..' segments")
    assert list(tmp_path.iterdir()) == []


# -- against the server ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_dataset_ingested_to_a_bucket_holds_the_bytes_of_a_local_ingest(run_cli, s3_server, bucket, tmp_path,
                                                                           staging):
    args = ("builtin:digits", "--split", "test", "--size", "12x12", "-q")
    assert run_cli("ingest", args[0], tmp_path / "local.zarr", *args[1:]).exit_code == 0
    result = run_cli("ingest", args[0], f"s3://{bucket}/sets/test.zarr", *args[1:], "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["path"] == f"s3://{bucket}/sets/test.zarr"
    assert objects(s3_server, bucket, "sets/test.zarr/") == files(tmp_path / "local.zarr")
    assert staged_entries(staging) == []


@pytest.mark.slow
def test_a_dataset_in_a_bucket_reads_back_through_the_toolkit(run_cli, bucket, tmp_path):
    from jepa_cli.data import store

    run_cli("ingest", "builtin:digits", tmp_path / "local.zarr", "--split", "test", "-q")
    run_cli("ingest", "builtin:digits", f"s3://{bucket}/test.zarr", "--split", "test", "-q")
    np.testing.assert_array_equal(store.read_array(f"s3://{bucket}/test.zarr/inputs"),
                                  read_zarr(tmp_path / "local.zarr" / "inputs"))
    info = run_cli("info", f"s3://{bucket}/test.zarr", "--json")
    assert info.exit_code == 0, info.stderr
    assert json.loads(info.stdout)["num_samples"] == 359  # digits' test split: 20% of each class of 1,797


@pytest.mark.slow
def test_an_existing_dataset_in_a_bucket_is_kept_without_force_and_replaced_with_it(run_cli, s3_server, bucket):
    url = f"s3://{bucket}/d.zarr"
    assert run_cli("ingest", "builtin:digits", url, "--split", "test", "-q").exit_code == 0
    assert_user_error(run_cli("ingest", "builtin:digits", url, "--split", "train", "-q"), "already exists")
    assert json.loads(objects(s3_server, bucket, "d.zarr/")["zarr.json"])["attributes"]["num_samples"] == 359
    assert run_cli("ingest", "builtin:digits", url, "--split", "train", "-q", "--force").exit_code == 0
    assert json.loads(objects(s3_server, bucket, "d.zarr/")["zarr.json"])["attributes"]["num_samples"] == 1438


@pytest.mark.slow
def test_an_output_whose_name_extends_its_inputs_does_not_overlap_it(run_cli, s3_server, bucket, tiny_run):
    url = f"s3://{bucket}/test.zarr"
    assert run_cli("ingest", "builtin:digits", url, "--split", "test", "--size", "16x16", "-q").exit_code == 0
    result = run_cli("encode-latents", tiny_run / "run", url, "-o", url + "2", "--mesh", "data=1", "-q")
    assert result.exit_code == 0, result.stderr
    assert "zarr.json" in objects(s3_server, bucket, "test.zarr2/")


@pytest.mark.slow
def test_a_mask_file_written_to_a_bucket_holds_the_bytes_of_a_local_one(run_cli, s3_server, bucket, tmp_path):
    assert run_cli("mask", "-o", tmp_path / "local.zarr", "-q").exit_code == 0
    assert run_cli("mask", "-o", f"s3://{bucket}/m.zarr", "-q").exit_code == 0
    assert objects(s3_server, bucket, "m.zarr/") == files(tmp_path / "local.zarr")
    info = run_cli("info", f"s3://{bucket}/m.zarr", "--json")
    assert json.loads(info.stdout)["kind"] == "masks"


@pytest.mark.slow
def test_a_bucket_that_does_not_exist_is_one_line(run_cli, bucket, staging):
    result = run_cli("ingest", "builtin:digits", f"s3://no-such-{bucket}/d.zarr", "-q")
    assert_user_error(result, f"bucket 'no-such-{bucket}' does not exist")
    assert staged_entries(staging) == []


@pytest.mark.slow
def test_wrong_credentials_are_one_line_and_write_nothing(run_cli, s3_server, bucket, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    result = run_cli("ingest", "builtin:digits", f"s3://{bucket}/d.zarr", "-q")
    assert_user_error(result, "the store refused the credentials", "AWS_SECRET_ACCESS_KEY")
    assert objects(s3_server, bucket) == {}


@pytest.mark.slow
@pytest.mark.parametrize("url", ["http://127.0.0.1/d.zarr", "ftp://host/d.zarr", "s3://{bucket}/a/../d.zarr",
                                 "s3:///d.zarr"])
def test_a_malformed_output_url_is_refused_and_nothing_is_written(run_cli, s3_server, bucket, url):
    result = run_cli("ingest", "builtin:digits", url.format(bucket=bucket), "-q")
    assert_user_error(result)
    assert objects(s3_server, bucket) == {}


@pytest.mark.slow
def test_objects_without_the_group_metadata_are_an_incomplete_dataset(run_cli, s3_server, bucket):
    client = s3_client(s3_server["endpoint"], s3_server["key"], s3_server["secret"])
    client.put_object(Bucket=bucket, Key="half.zarr/inputs/zarr.json", Body=b"{}")
    assert_user_error(run_cli("info", f"s3://{bucket}/half.zarr"), "incomplete")
    assert_user_error(run_cli("probe", "knn", f"s3://{bucket}/half.zarr", f"s3://{bucket}/half.zarr"), "incomplete")


@pytest.mark.slow
def test_an_object_jepa_did_not_write_is_never_replaced(run_cli, s3_server, bucket):
    client = s3_client(s3_server["endpoint"], s3_server["key"], s3_server["secret"])
    client.put_object(Bucket=bucket, Key="mine/notes.txt", Body=b"keep me")
    assert_user_error(run_cli("ingest", "builtin:digits", f"s3://{bucket}/mine", "-q", "--force"),
                      "notes.txt, which jepa did not write")
    assert objects(s3_server, bucket) == {"mine/notes.txt": b"keep me"}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A run of the tiny recipe at initialisation (step 0) on 16x16 digits, and the local datasets."""
    from click.testing import CliRunner

    from jepa_cli.cli.main import cli

    root = tmp_path_factory.mktemp("bucket-run")
    for side in ("train", "test"):
        result = CliRunner().invoke(cli, ["ingest", "builtin:digits", str(root / f"{side}.zarr"), "--split", side,
                                          "--size", "16x16", "-q"], catch_exceptions=False)
        assert result.exit_code == 0, result.stderr
    result = CliRunner().invoke(cli, ["train", "--config", str(RECIPE), "--data", str(root / "train.zarr"), "--out",
                                      str(root / "run"), "--steps", "0", "--batch-size", "8", "--mesh", "data=1", "-q"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return root


@pytest.mark.slow
def test_encode_and_probe_with_everything_in_a_bucket_give_the_local_table(run_cli, bucket, tiny_run):
    run, tables = tiny_run / "run", {}
    for where in (str(tiny_run / "local-"), f"s3://{bucket}/"):
        for side in ("train", "test"):
            data = f"{where}{side}.zarr" if where.startswith("s3") else tiny_run / f"{side}.zarr"
            if where.startswith("s3"):
                assert run_cli("ingest", "builtin:digits", data, "--split", side, "--size", "16x16", "-q").exit_code == 0
            result = run_cli("encode-latents", run, data, "-o", f"{where}emb-{side}.zarr", "--mesh", "data=1", "-q")
            assert result.exit_code == 0, result.stderr
        result = run_cli("probe", "knn", f"{where}emb-train.zarr", f"{where}emb-test.zarr", "--json")
        assert result.exit_code == 0, result.stderr
        tables[where] = json.loads(result.stdout)
    local, remote = tables.values()
    assert {k: v for k, v in remote.items() if k not in ("train", "test", "encoder", "seconds")} == \
        {k: v for k, v in local.items() if k not in ("train", "test", "encoder", "seconds")}


@pytest.mark.slow
def test_train_reads_its_dataset_from_a_bucket(run_cli, bucket, tmp_path):
    assert run_cli("ingest", "builtin:digits", f"s3://{bucket}/train.zarr", "--size", "16x16", "-q").exit_code == 0
    result = run_cli("train", "--config", RECIPE, "--data", f"s3://{bucket}/train.zarr", "--out", tmp_path / "run",
                     "--steps", "2", "--batch-size", "8", "--mesh", "data=1", "-q", "--json")
    assert result.exit_code == 0, result.stderr
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())
    assert f"s3://{bucket}/train.zarr" in json.dumps(recorded)


@pytest.mark.slow
def test_the_server_stopped_mid_write_leaves_nothing_readable_as_complete(run_cli, monkeypatch, staging, tmp_path):
    """A server of its own, in this process (its objects outlive a stop), stopped after the first object
    of the publication is stored; started again, the prefix reads as incomplete and a rerun finishes."""
    from moto.server import ThreadedMotoServer

    from jepa_cli.data import buckets

    monkeypatch.setattr(logging.getLogger("werkzeug"), "level", logging.ERROR)  # the server's request log
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        s3_client(endpoint, "k", "s").create_bucket(Bucket="cut")
        point_at(monkeypatch, endpoint, "k", "s")
        opened = buckets.open_store

        class StopsAfterFirstWrite:
            """The store, whose server stops once the first object of the publication written through it
            is stored (the writer's lease is written on a condition, the publication's objects are not)."""

            def __init__(self, real):
                self.real = real

            def __getattr__(self, name):
                return getattr(self.real, name)

            stopped = False

            def write(self, key, value, **condition):
                future = self.real.write(key, value, **condition)
                if not self.stopped and not condition:
                    future.result()
                    server.stop()
                    self.stopped = True
                return future

        monkeypatch.setattr(buckets, "open_store", lambda url: StopsAfterFirstWrite(opened(url)))
        monkeypatch.setattr(buckets, "keys", lambda url: [])  # the checks before the publication list nothing
        result = run_cli("ingest", "builtin:digits", "s3://cut/d.zarr", "--split", "test", "-q")
        assert result.exit_code != 0
        assert len(result.stderr.strip().splitlines()) == 1 and "cannot reach the object store" in result.stderr
        assert staged_entries(staging) == []
        monkeypatch.undo()
        point_at(monkeypatch, endpoint, "k", "s")
        monkeypatch.setattr(tempfile, "tempdir", str(staging))
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        assert objects({"endpoint": endpoint, "key": "k", "secret": "s"}, "cut") != {}  # the first object is there
        assert_user_error(run_cli("info", "s3://cut/d.zarr"), "incomplete")
        assert run_cli("ingest", "builtin:digits", "s3://cut/d.zarr", "--split", "test", "-q").exit_code == 0
        run_cli("ingest", "builtin:digits", tmp_path / "local.zarr", "--split", "test", "-q")
        assert objects({"endpoint": endpoint, "key": "k", "secret": "s"}, "cut", "d.zarr/") == \
            files(tmp_path / "local.zarr")
    finally:
        server.stop()


@pytest.mark.slow
def test_an_interrupted_encode_to_a_bucket_publishes_nothing_and_its_rerun_resumes(s3_server, bucket, tmp_path,
                                                                                     staging):
    from jepa_cli.data import store
    from jepa_cli.evaluation.encode import encode_dataset, partial_path
    from tests.test_encode import image_dataset, stand_in_encoder, stand_in_params

    class Interrupt(Exception):
        pass

    data = image_dataset(tmp_path / "data.zarr", n=50)
    kw = dict(pool="none", batch_size=6, chunk_n=4, job={"what": "stand-in"})
    encode_dataset(data, tmp_path / "whole.zarr", stand_in_encoder, stand_in_params(), **kw)
    seen = []

    def stop_mid_way(rows):
        seen.append(rows)
        if sum(seen) >= 30:  # in the fourth unit of 8 rows
            raise Interrupt

    url = f"s3://{bucket}/emb.zarr"
    with pytest.raises(Interrupt):
        encode_dataset(data, url, stand_in_encoder, stand_in_params(), on_progress=stop_mid_way, **kw)
    assert objects(s3_server, bucket) == {} and partial_path(url).exists()
    resumed = encode_dataset(data, url, stand_in_encoder, stand_in_params(), **kw)
    assert resumed["units_resumed"] == 3
    np.testing.assert_array_equal(store.read_array(f"{url}/inputs"), read_zarr(tmp_path / "whole.zarr" / "inputs"))
    assert staged_entries(staging) == []
