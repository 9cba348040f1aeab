"""The writer lock of an output in a bucket: a lease object (`locks.LeaseLock`), against a real S3
server on 127.0.0.1 (moto's, the session's server of tests/test_buckets.py).

A lease is `PREFIX/.jepa-lease`, {"holder": "HOST:PID", "token", "expires"}, created only where none
is (If-None-Match), renewed and taken over only from the generation read (If-Match), deleted by its
holder only. Each test gets a fresh bucket.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jepa_cli.data import locks
from jepa_cli.errors import InputError
from tests.conftest import assert_user_error
from tests.test_buckets import bucket, files, objects, s3_client, s3_server, staging  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[1]
ME = f"{socket.gethostname()}:{os.getpid()}"
HOLDS = """
import sys, time
from jepa_cli.data.locks import LeaseLock
from jepa_cli.data.urls import location
lease = LeaseLock(location(sys.argv[1]), seconds=float(sys.argv[2]))
lease.acquire()
print(lease.name, flush=True)
time.sleep(600)
"""
RACES = """
import json, sys, time
from jepa_cli.data.locks import LeaseLock
from jepa_cli.data.urls import location
from jepa_cli.errors import InputError
prefix, start, rounds, apart = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
won = []
for i in range(rounds):
    time.sleep(max(0.0, start + i * apart - time.time()))  # both processes try at the same instant
    lease = LeaseLock(location(f"{prefix}/round-{i}"))
    try:
        won.append(lease.acquire())
    except InputError:
        won.append(False)
    time.sleep(max(0.0, start + (i + 0.6) * apart - time.time()))  # the other has tried by now
    lease.release()
print(json.dumps(won))
"""


def url_of(bucket: str, key: str = "out.zarr"):
    from jepa_cli.data.urls import location

    return location(f"s3://{bucket}/{key}")


def put_lease(s3_server, bucket: str, key: str, holder: str, expires: float) -> bytes:
    """Writes a lease of another process with boto3; its bytes."""
    body = json.dumps({"holder": holder, "token": "f" * 32, "expires": expires}).encode()
    s3_client(s3_server["endpoint"], s3_server["key"], s3_server["secret"]).put_object(
        Bucket=bucket, Key=f"{key}/.jepa-lease", Body=body)
    return body


def lease_object(s3_server, bucket: str, key: str = "out.zarr") -> dict | None:
    found = objects(s3_server, bucket, f"{key}/").get(".jepa-lease")
    return None if found is None else json.loads(found)


def start_holder(url, seconds: float = 60.0) -> tuple[subprocess.Popen, str]:
    """A process that takes the lease of `url` and keeps it (renewing) until killed; it and its name."""
    process = subprocess.Popen([sys.executable, "-c", HOLDS, str(url), str(seconds)], cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    name = process.stdout.readline().strip()
    assert name, "the holder did not take the lease"
    return process, name


@pytest.mark.slow
def test_a_lease_records_its_holder_a_token_and_its_expiry(s3_server, bucket):
    before = time.time()
    lease = locks.LeaseLock(url_of(bucket), seconds=60)
    lease.acquire()
    after = time.time()
    try:
        record = lease_object(s3_server, bucket)
        assert record["holder"] == ME
        assert len(record["token"]) == 32 and int(record["token"], 16) >= 0
        assert before + 60 - 0.01 <= record["expires"] <= after + 60 + 0.01
    finally:
        lease.release()


@pytest.mark.slow
def test_a_second_lease_on_one_prefix_is_refused_naming_the_first_holder(s3_server, bucket):

    first = locks.LeaseLock(url_of(bucket))
    first.acquire()
    try:
        with pytest.raises(InputError) as refused:
            locks.LeaseLock(url_of(bucket)).acquire()
        assert f"another process ({ME}) is writing it now" in str(refused.value)
        assert "\n" not in str(refused.value)
        assert locks.LeaseLock(url_of(bucket)).holder() == ME
    finally:
        first.release()


def test_make_lock_gives_a_lease_for_a_bucket_url_and_a_flock_for_a_path(tmp_path):

    assert isinstance(locks.make_lock("s3://bkt/out.zarr"), locks.LeaseLock)
    assert isinstance(locks.make_lock(url_of("bkt")), locks.LeaseLock)
    assert isinstance(locks.make_lock(tmp_path), locks.FlockLock)


@pytest.mark.slow
def test_a_lease_written_between_a_read_and_the_write_is_not_overwritten(s3_server, bucket, monkeypatch):
    """The second process reads no lease, then the first writes its own: the second's write, made on
    the condition that there is none, fails, and it is refused naming the first."""
    from jepa_cli.data import buckets

    opened = buckets.open_store
    first = locks.LeaseLock(url_of(bucket))
    firsts = []  # the lease object as the first wrote it

    class FirstWritesAfterTheRead:
        def __init__(self, real):
            self.real = real

        def __getattr__(self, name):
            return getattr(self.real, name)

        def read(self, key):
            future = self.real.read(key)
            if not firsts:
                future.result()
                monkeypatch.setattr(buckets, "open_store", opened)
                first.acquire()
                firsts.append(objects(s3_server, bucket, "out.zarr/")[".jepa-lease"])
            return future

    monkeypatch.setattr(buckets, "open_store", lambda url: FirstWritesAfterTheRead(opened(url)))
    second = locks.LeaseLock(url_of(bucket))
    try:
        with pytest.raises(InputError, match=f"another process \\({ME}\\)"):
            second.acquire()
        assert objects(s3_server, bucket, "out.zarr/")[".jepa-lease"] == firsts[0]
    finally:
        first.release()


@pytest.mark.slow
def test_two_processes_racing_for_fresh_leases_ten_times_exactly_one_wins_each_time(s3_server, bucket):
    rounds, apart = 10, 0.4
    start = time.time() + 6  # both have imported TensorStore by then
    racers = [subprocess.Popen([sys.executable, "-c", RACES, f"s3://{bucket}/race", str(start), str(rounds),
                                str(apart)], cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
              for _ in range(2)]
    won = []
    for racer in racers:
        out, err = racer.communicate(timeout=120)
        assert racer.returncode == 0, err
        won.append(json.loads(out))
    assert [a + b for a, b in zip(*won)] == [1] * rounds


@pytest.mark.slow
def test_an_expired_lease_is_taken_over(s3_server, bucket):
    put_lease(s3_server, bucket, "out.zarr", "gone-host:4242", expires=time.time() - 1)
    lease = locks.LeaseLock(url_of(bucket))
    assert lease.acquire() is True
    try:
        assert lease_object(s3_server, bucket)["holder"] == ME
        assert lease_object(s3_server, bucket)["token"] != "f" * 32
    finally:
        lease.release()


@pytest.mark.slow
def test_a_live_lease_of_another_process_is_not_taken_over(s3_server, bucket):

    body = put_lease(s3_server, bucket, "out.zarr", "other-host:4242", expires=time.time() + 30)
    with pytest.raises(InputError, match="another process \\(other-host:4242\\) is writing it now"):
        locks.LeaseLock(url_of(bucket)).acquire()
    assert objects(s3_server, bucket, "out.zarr/")[".jepa-lease"] == body


@pytest.mark.slow
def test_a_renewed_lease_outlives_its_duration(s3_server, bucket):

    holder = locks.LeaseLock(url_of(bucket), seconds=1.5)
    holder.acquire()
    try:
        time.sleep(4)  # more than twice the lease's duration: only renewals keep it
        assert lease_object(s3_server, bucket)["expires"] > time.time()
        with pytest.raises(InputError, match="is writing it now"):
            locks.LeaseLock(url_of(bucket)).acquire()
        holder.confirm()
    finally:
        holder.release()


@pytest.mark.slow
def test_a_killed_holders_lease_expires_and_the_next_writer_takes_it_over(s3_server, bucket):

    process, name = start_holder(url_of(bucket), seconds=2)
    try:
        with pytest.raises(InputError, match=f"another process \\({name}\\)"):
            locks.LeaseLock(url_of(bucket)).acquire()
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    expires = lease_object(s3_server, bucket)["expires"]
    time.sleep(max(0.0, expires - time.time()) + 0.2)
    lease = locks.LeaseLock(url_of(bucket))
    assert lease.acquire() is True
    lease.release()


@pytest.mark.slow
def test_acquire_with_wait_takes_the_lease_once_its_holder_releases_it(s3_server, bucket):
    import threading

    first = locks.LeaseLock(url_of(bucket))
    first.acquire()
    releasing = threading.Timer(1.5, first.release)
    releasing.start()
    began = time.monotonic()
    second = locks.LeaseLock(url_of(bucket))
    try:
        assert second.acquire(wait=True) is True
        assert time.monotonic() - began >= 1.5
    finally:
        releasing.join()
        second.release()


@pytest.mark.slow
def test_release_deletes_the_lease(s3_server, bucket):
    lease = locks.LeaseLock(url_of(bucket))
    lease.acquire()
    lease.release()
    assert objects(s3_server, bucket) == {}


@pytest.mark.slow
def test_release_leaves_the_lease_of_a_process_that_took_it_over(s3_server, bucket):
    lease = locks.LeaseLock(url_of(bucket))
    lease.acquire()
    body = put_lease(s3_server, bucket, "out.zarr", "other-host:4242", expires=time.time() + 60)
    lease.release()
    assert objects(s3_server, bucket, "out.zarr/")[".jepa-lease"] == body


@pytest.mark.slow
def test_a_lease_taken_over_is_lost_and_confirm_refuses_naming_the_new_holder(s3_server, bucket):

    lease = locks.LeaseLock(url_of(bucket))
    lease.acquire()
    put_lease(s3_server, bucket, "out.zarr", "other-host:4242", expires=time.time() + 60)
    try:
        with pytest.raises(InputError, match="lost its writer lease \\(other-host:4242 took it over"):
            lease.confirm()
    finally:
        lease.release()


@pytest.mark.slow
def test_a_writer_that_lost_its_lease_publishes_nothing(s3_server, bucket):
    from jepa_cli.data import atomic

    body = None
    with pytest.raises(InputError, match="lost its writer lease"):
        with atomic.atomic_directory(f"s3://{bucket}/out.zarr", False, "dataset") as tmp:
            (tmp / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group",
                                                       "attributes": {"jepa_kind": "dataset"}}))
            body = put_lease(s3_server, bucket, "out.zarr", "other-host:4242", expires=time.time() + 60)
    assert objects(s3_server, bucket) == {"out.zarr/.jepa-lease": body}


@pytest.mark.slow
def test_a_lease_lost_while_the_arrays_upload_leaves_no_commit(s3_server, bucket, monkeypatch):
    """Another process takes the lease over once the first array object is stored: the group's
    zarr.json, the commit, is not written, so readers see an incomplete output."""
    from jepa_cli.data import atomic, buckets

    opened = buckets.open_store

    class TakenOverAfterFirstObject:
        def __init__(self, real):
            self.real = real

        def __getattr__(self, name):
            return getattr(self.real, name)

        def write(self, key, value, **condition):
            future = self.real.write(key, value, **condition)
            if not condition and key != "zarr.json":  # an object of the publication, not the lease
                future.result()
                put_lease(s3_server, bucket, "out.zarr", "other-host:4242", expires=time.time() + 60)
            return future

    with pytest.raises(InputError, match="lost its writer lease \\(other-host:4242 took it over"):
        with atomic.atomic_directory(f"s3://{bucket}/out.zarr", False, "dataset") as tmp:
            (tmp / "inputs").mkdir()
            for folder in (tmp, tmp / "inputs"):
                (folder / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group"}))
            monkeypatch.setattr(buckets, "open_store", lambda url: TakenOverAfterFirstObject(opened(url)))
    assert sorted(objects(s3_server, bucket)) == ["out.zarr/.jepa-lease", "out.zarr/inputs/zarr.json"]


@pytest.mark.slow
def test_a_store_that_ignores_the_conditions_is_refused_in_one_line(s3_server, bucket, monkeypatch):
    from jepa_cli.data import buckets

    opened = buckets.open_store

    class IgnoresConditions:
        def __init__(self, real):
            self.real = real

        def __getattr__(self, name):
            return getattr(self.real, name)

        def write(self, key, value, if_equal=None):
            return self.real.write(key, value)

    monkeypatch.setattr(buckets, "open_store", lambda url: IgnoresConditions(opened(url)))
    with pytest.raises(InputError) as refused:
        locks.LeaseLock(url_of(bucket)).acquire()
    assert "cannot give the writer-lock guarantee" in str(refused.value) and "\n" not in str(refused.value)
    assert locks.this_process_lease(url_of(bucket)) is None


@pytest.mark.slow
def test_the_lease_is_no_part_of_the_artifact_listed_or_cleared(s3_server, bucket):
    from jepa_cli.data import buckets

    client = s3_client(s3_server["endpoint"], s3_server["key"], s3_server["secret"])
    for key in ("zarr.json", "inputs/zarr.json", "inputs/c/0/0"):
        client.put_object(Bucket=bucket, Key=f"out.zarr/{key}", Body=b"{}")
    lease = locks.LeaseLock(url_of(bucket))
    lease.acquire()
    try:
        assert buckets.keys(url_of(bucket)) == ["inputs/c/0/0", "inputs/zarr.json", "zarr.json"]
        buckets.clear(url_of(bucket))
        assert list(objects(s3_server, bucket)) == ["out.zarr/.jepa-lease"]
    finally:
        lease.release()


# -- the commands -----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_second_ingest_while_a_first_writer_holds_the_lease_exits_2_and_the_output_is_intact(
        run_cli, s3_server, bucket):
    url = f"s3://{bucket}/d.zarr"
    assert run_cli("ingest", "builtin:digits", url, "--split", "test", "--size", "8x8", "-q").exit_code == 0
    published = objects(s3_server, bucket, "d.zarr/")
    process, name = start_holder(url_of(bucket, "d.zarr"))  # a first writer, rewriting it with --force
    try:
        result = run_cli("ingest", "builtin:digits", url, "--split", "train", "--size", "8x8", "-q", "--force")
        assert_user_error(result, f"{url}: another process ({name}) is writing it now")
        assert {k: v for k, v in objects(s3_server, bucket, "d.zarr/").items() if k != ".jepa-lease"} == published
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()


@pytest.mark.slow
def test_two_ingests_to_one_output_at_once_leave_one_whole_output(s3_server, bucket, tmp_path):
    """Whichever way they interleave: one writes it, the other is refused in one line (the lease is held,
    or the output exists), and the output holds the bytes of a local ingest."""
    url = f"s3://{bucket}/d.zarr"
    args = ["ingest", "builtin:digits", "--split", "test", "--size", "8x8", "-q"]
    writers = [subprocess.Popen([sys.executable, "-m", "jepa_cli", *args[:2], url, *args[2:]], cwd=ROOT, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    ends = [(w.wait(timeout=300), w.stderr.read()) for w in writers]
    assert sorted(code for code, _ in ends) == [0, 2], ends
    refusal = next(err for code, err in ends if code == 2).strip()
    assert len(refusal.splitlines()) == 1 and ("is writing it now" in refusal or "already exists" in refusal)
    subprocess.run([sys.executable, "-m", "jepa_cli", *args[:2], str(tmp_path / "local.zarr"), *args[2:]], cwd=ROOT,
                   check=True)
    assert objects(s3_server, bucket, "d.zarr/") == files(tmp_path / "local.zarr")


@pytest.mark.slow
def test_a_second_mask_file_writer_is_refused_while_the_lease_is_held(run_cli, s3_server, bucket):
    process, name = start_holder(url_of(bucket, "m.zarr"))
    try:
        assert_user_error(run_cli("mask", "-o", f"s3://{bucket}/m.zarr", "-q"), f"another process ({name})")
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert list(objects(s3_server, bucket)) == ["m.zarr/.jepa-lease"]


@pytest.mark.slow
def test_an_encode_to_a_bucket_output_whose_lease_is_held_is_refused_and_writes_nothing(s3_server, bucket, tmp_path,
                                                                                      staging):
    from jepa_cli.evaluation.encode import encode_dataset, partial_path
    from tests.test_encode import image_dataset, stand_in_encoder, stand_in_params

    data = image_dataset(tmp_path / "data.zarr", n=10)
    url = f"s3://{bucket}/emb.zarr"
    process, name = start_holder(url_of(bucket, "emb.zarr"))
    try:
        with pytest.raises(InputError, match=f"another process \\({name}\\) is writing it now"):
            encode_dataset(data, url, stand_in_encoder, stand_in_params(), pool="none", batch_size=5, chunk_n=5,
                           job={"what": "stand-in"})
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert not partial_path(url).exists()
    assert list(objects(s3_server, bucket)) == ["emb.zarr/.jepa-lease"]
