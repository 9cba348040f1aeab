"""Where an artifact lives: a local path, or `s3://BUCKET/PATH` / `gs://BUCKET/PATH` in object storage.

`location` turns a path argument into a `Path` or a `BucketPath`; a malformed URL, an unsupported
scheme, a `.` or `..` segment or an empty bucket is one InputError. A `BucketPath` joins names with
`/` like a Path and gives the TensorStore kvstore spec of its prefix (`kvstore`), with the endpoint,
region and credentials taken from the variables the AWS SDKs and Google's client libraries read
(`BUCKET_VARIABLES`, docs/cli-conventions.md). Every read and write of a bucket goes through
TensorStore's `s3` and `gcs` kvstore drivers.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from jepa_cli.errors import InputError, JepaError

DRIVERS = {"s3": "s3", "gs": "gcs"}  # URL scheme -> TensorStore kvstore driver
# The environment variables that reach a bucket, and what each sets (`jepa env` lists which are set).
BUCKET_VARIABLES: dict[str, str] = {
    "AWS_ENDPOINT_URL_S3": "s3:// endpoint (an S3-compatible server); wins over AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL": "s3:// endpoint for every AWS service",
    "AWS_REGION": "s3:// region; wins over AWS_DEFAULT_REGION",
    "AWS_DEFAULT_REGION": "s3:// region",
    "AWS_ACCESS_KEY_ID": "s3:// access key (with AWS_SECRET_ACCESS_KEY)",
    "AWS_SECRET_ACCESS_KEY": "s3:// secret key",
    "AWS_SESSION_TOKEN": "s3:// session token of temporary credentials",
    "AWS_PROFILE": "s3:// profile of ~/.aws/credentials, when no key is in the environment",
    "GOOGLE_APPLICATION_CREDENTIALS": "gs:// service account key file (else gcloud's default credentials)",
    "JEPA_BUCKET_RETRIES": "retries of a failed bucket request (default 8, backing off 0.5 s to 8 s)",
}
DEFAULT_RETRIES = 8  # TensorStore's own default (32, up to 32 s apart) keeps a command waiting ~15 minutes
_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)", re.S)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")  # S3 and GCS bucket naming rules, merged


@dataclass(frozen=True)
class BucketPath:
    """An object-storage prefix `SCHEME://BUCKET/KEY` (KEY without leading or trailing `/`, never
    empty). Joins like a Path (`url / "inputs"`); `str()` gives the URL back."""

    scheme: str  # "s3" or "gs"
    bucket: str
    key: str

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}"

    def __truediv__(self, name: str | os.PathLike) -> BucketPath:
        return BucketPath(self.scheme, self.bucket, f"{self.key}/{os.fspath(name).strip('/')}")

    @property
    def name(self) -> str:
        """The last segment of the key (as Path.name)."""
        return self.key.rsplit("/", 1)[-1]

    def resolve(self) -> BucketPath:
        """The URL itself: it is absolute already (as Path.resolve)."""
        return self

    def kvstore(self, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The TensorStore kvstore spec of this prefix (its path ends in `/`), with endpoint, region,
        credentials and retries from `environ` (default: this process's environment)."""
        return kvstore_spec(self, os.environ if environ is None else environ)

    def exists(self) -> bool:
        """Whether a zarr node (its zarr.json) or any object lies under this prefix."""
        import tensorstore as ts

        try:
            store = ts.KvStore.open(self.kvstore()).result()
            return store.read("zarr.json").result().state == "value" or bool(store.list().result())
        except ValueError as exc:
            raise failure(self, exc) from None


def location(value: str | os.PathLike | BucketPath) -> Path | BucketPath:
    """The local path or bucket URL a path argument names; InputError (one line) for a URL this
    toolkit cannot address: a scheme other than s3:// and gs://, an empty or invalid bucket name, no
    path inside the bucket, an empty, `.` or `..` segment, or a query, fragment or control character."""
    if isinstance(value, (BucketPath, Path)):
        return value
    text = os.fspath(value)
    if not isinstance(text, str):
        return Path(os.fsdecode(text))
    found = _URL.fullmatch(text)
    if found is None:
        if re.match(r"(s3|gs):", text, re.I):
            raise InputError(f"{text}: malformed bucket URL; write s3://BUCKET/PATH or gs://BUCKET/PATH")
        return Path(text)
    scheme, rest = found.group(1).lower(), found.group(2)
    if scheme not in DRIVERS:
        raise InputError(f"{text}: unsupported scheme {scheme}://; a path is local, s3://BUCKET/PATH or "
                         "gs://BUCKET/PATH")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise InputError(f"{text}: malformed bucket URL (no bucket name); write {scheme}://BUCKET/PATH")
    if not _BUCKET.fullmatch(bucket):
        raise InputError(f"{text}: {bucket!r} is not a valid bucket name (3 to 222 lowercase letters, digits, "
                         "'.', '-' or '_', starting and ending with a letter or digit)")
    if any(ch in key for ch in "?#") or any(ord(ch) < 32 or ord(ch) == 127 for ch in key):
        raise InputError(f"{text}: malformed bucket URL (a query, fragment or control character in the path)")
    key = key[:-1] if key.endswith("/") else key
    if not key:
        raise InputError(f"{text}: needs a path inside the bucket ({scheme}://{bucket}/PATH), not the bucket itself")
    segments = key.split("/")
    if ".." in segments or "." in segments:
        raise InputError(f"{text}: a bucket path may not hold '.' or '..' segments (an object store has no "
                         "parent folders to resolve them against)")
    if "" in segments:
        raise InputError(f"{text}: malformed bucket URL (an empty segment, '//', in the path)")
    return BucketPath(scheme, bucket, key)


def is_bucket(value: Any) -> bool:
    """Whether `value` (a path argument or a parsed location) names a bucket URL."""
    return isinstance(value, BucketPath) or isinstance(value, str) and _URL.fullmatch(value) is not None


def bucket_run_refusal(url: str | BucketPath) -> InputError:
    """The refusal of a run in a bucket by a command that reads runs: `jepa train` (and its --resume),
    encode-latents and probe --run read runs in a bucket, each through a local copy (training/bucket_run.py)."""
    return InputError(f"{url}: this command reads runs in a local folder only (a run in a bucket is read by "
                      "jepa train, encode-latents and probe --run); copy it to a folder first, e.g. aws s3 sync "
                      "URL DIR")


def retries(environ: Mapping[str, str]) -> int:
    """The retries of a failed bucket request: JEPA_BUCKET_RETRIES, else DEFAULT_RETRIES."""
    text = environ.get("JEPA_BUCKET_RETRIES", "").strip()
    if not text:
        return DEFAULT_RETRIES
    if not text.isdecimal():
        raise InputError(f"JEPA_BUCKET_RETRIES={text!r}: must be a whole number of retries (0 or more)")
    return int(text)


def kvstore_spec(url: BucketPath, environ: Mapping[str, str]) -> dict[str, Any]:
    """The TensorStore kvstore spec of the prefix `url` (path ending in `/`), configured from
    `environ`: for s3://, the endpoint (AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL), the region
    (AWS_REGION, else AWS_DEFAULT_REGION) and the credentials (the environment's keys when
    AWS_ACCESS_KEY_ID is set, else the AWS default chain: profile files, instance metadata); for
    gs://, Google's default credentials (GOOGLE_APPLICATION_CREDENTIALS, gcloud's login, metadata).
    Conditional writes go to the server as such (S3 If-None-Match / If-Match; GCS ifGenerationMatch).
    A failed request is retried `retries(environ)` times, 0.5 s to 8 s apart."""
    backoff = {"max_retries": retries(environ), "initial_delay": "0.5s", "max_delay": "8s"}
    spec: dict[str, Any] = {"driver": DRIVERS[url.scheme], "bucket": url.bucket, "path": url.key + "/"}
    if url.scheme == "s3":
        endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
        region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
        if endpoint:
            spec["endpoint"] = endpoint
        if region:
            spec["aws_region"] = region
        if environ.get("AWS_ACCESS_KEY_ID"):
            spec["aws_credentials"] = {"type": "environment"}
        # A conditional write (the writer's lease, locks.LeaseLock) as one PUT carrying If-None-Match /
        # If-Match, which the server enforces atomically. Unset, TensorStore does so only for AWS's own
        # endpoints and precedes the PUT with a HEAD checking the condition elsewhere, which would hide a
        # server that ignores the headers from the lease's check that the store enforces them.
        spec["use_conditional_write"] = True
        spec["context"] = {"s3_request_retries": backoff}
    else:
        spec["context"] = {"gcs_request_retries": backoff}
    return spec


def variables_set(environ: Mapping[str, str] | None = None) -> dict[str, bool]:
    """For each of BUCKET_VARIABLES, whether it is set (non-empty) in `environ`; never the values."""
    environ = os.environ if environ is None else environ
    return {name: bool(environ.get(name)) for name in BUCKET_VARIABLES}


def failure(url: BucketPath | str, exc: BaseException) -> JepaError:
    """One line for a failed request to the bucket of `url`: InputError when the user must fix the
    URL or the credentials, JepaError (exit 1) when the store could not be reached or failed."""
    text = " ".join(str(exc).split())
    bucket = url.bucket if isinstance(url, BucketPath) else str(url)
    if "NoSuchBucket" in text:
        return InputError(f"{url}: bucket {bucket!r} does not exist (create it first, or check the URL and "
                          "AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL)")
    if text.startswith(("PERMISSION_DENIED", "UNAUTHENTICATED")) or re.search(
            r"InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied|ExpiredToken", text):
        code = re.search(r"PERMISSION_DENIED: (\w+)|UNAUTHENTICATED: (\w+)", text)
        cause = next((g for g in code.groups() if g), "access denied") if code else "access denied"
        return InputError(f"{url}: the store refused the credentials ({cause}); check AWS_ACCESS_KEY_ID and "
                          "AWS_SECRET_ACCESS_KEY (s3://) or GOOGLE_APPLICATION_CREDENTIALS (gs://)")
    reason = re.sub(r"\s*\[[a-z_]+=.*", "", text)[:200]
    if "retry attempts failed" in reason or "CURL error" in reason:
        reason = re.sub(r"^[A-Z_]+: ", "", reason)
        return JepaError(f"{url}: cannot reach the object store ({reason}); nothing was published, run the "
                         "command again once it answers")
    return JepaError(f"{url}: object store request failed ({reason})")
