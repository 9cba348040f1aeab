"""Locks, one interface (`Lock`) for a run directory, a partial output and an output folder, with an
implementation for each kind of storage, which `make_lock` chooses by path.

On a local file system: flock(2) (`FlockLock`), which the kernel drops when the process dies (SIGKILL
included), so a lock never outlives its holder.

In object storage (s3://, gs://), which has no flock: a lease object (`LeaseLock`), the writer lock
of an output. A writer holds `PREFIX/.jepa-lease` (`buckets.LEASE_KEY`), the JSON {"holder":
"HOST:PID", "token": random hex, "expires": unix seconds}:
- acquire: read it; absent, expired (`expires` past on this host's clock), not a lease (unparsable)
  or left by this very process (a release that could not reach the store): write this process's on
  the condition that the object is still the one read (S3 `If-None-Match: *` for none, `If-Match:
  ETAG` for one read; GCS `ifGenerationMatch`), so of processes racing for it exactly one wins;
  held by another process: the refusal naming its holder.
- renew: a thread swaps it for one with `expires` LEASE_SECONDS ahead every RENEW_EVERY of that, on
  the condition that it is still the generation this process wrote last. A failed swap (it expired
  and another process took it over, or it was removed) or no renewal before `expires` marks it lost;
  `confirm` then refuses in one line, and a publication calls it before it clears and before it
  commits, so a writer that lost its lease publishes nothing.
- release: stop renewing, and delete it on the condition that it is still this process's.
The store must enforce those conditions: the first lease on a bucket repeats the acquisition's
condition and swaps on a generation its renewal replaced, and refuses (one line) where either write
succeeds. Hosts' clocks must agree to well within LEASE_SECONDS (NTP does). Fencing is beyond an
object store: a writer paused for longer than the lease between its last `confirm` and its commit
could still commit after a takeover.
"""

from __future__ import annotations

import abc
import contextlib
import fcntl
import json
import os
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from jepa_cli.data import buckets
from jepa_cli.data.urls import BucketPath, failure, location
from jepa_cli.errors import InputError, JepaError

# How long a lease outlives its last renewal: a killed writer's output is free again within a minute,
# and renewing every 20 s (RENEW_EVERY) leaves room for two renewals, each of which TensorStore may
# retry for up to ~40 s (urls.DEFAULT_RETRIES: 8 retries, 0.5 s to 8 s apart), before it expires.
LEASE_SECONDS = 60.0
RENEW_EVERY = 1 / 3  # of the lease's duration
POLL_SECONDS = 1.0  # between looks at a lease held by another process, when acquiring with `wait`


class Lock(abc.ABC):
    """An exclusive lock on one path, held by one process at a time: what every store implements."""

    @abc.abstractmethod
    def acquire(self, wait: bool = False) -> bool:
        """Takes the lock: True when held, False on storage that cannot lock (the caller goes on
        unlocked). Without `wait`, the lock's refusal (an InputError naming the holder) when another
        process holds it; with `wait`, waits for it. OSError when the path cannot be opened."""

    @abc.abstractmethod
    def release(self) -> None:
        """Lets the lock go (nothing when it is not held)."""

    @abc.abstractmethod
    def holder(self) -> str | None:
        """Who holds the lock now (a pid, HOST:PID, or "unknown"), or None when no process holds it (or
        the storage cannot tell). Looks without waiting and without creating anything."""

    def confirm(self) -> None:
        """Nothing while this process still holds the lock; the lock's InputError when it lost it since
        `acquire` (a lease that expired and another process took over). A flock is never lost."""

    @contextlib.contextmanager
    def held(self, wait: bool = False) -> Iterator[bool]:
        """Holds the lock for the block (`acquire`'s result as the value), released however it ends."""
        try:
            yield self.acquire(wait)
        finally:
            self.release()


class FlockLock(Lock):
    """flock(2) on `path`: a directory, locked through its own descriptor (`pid_file` False), or a lock
    file created to hold the holder's pid and removed on release (`pid_file` True). `refusal(holder)`
    is the InputError when another process holds it; `follow_links` False refuses a symbolic link at
    `path` (an OSError), so a lock is never taken through a link that appeared since a check."""

    def __init__(self, path: str | os.PathLike, refusal: Callable[[str], InputError] | None = None,
                 pid_file: bool = False, follow_links: bool = True) -> None:
        self.path = Path(path)
        self.refusal = refusal or (lambda holder: InputError(f"{path}: another process (pid {holder}) holds it; "
                                                             "wait for it to finish"))
        self.pid_file = pid_file
        self._flags = (os.O_RDWR | os.O_CREAT if pid_file else os.O_RDONLY | os.O_DIRECTORY) \
            | (0 if follow_links else os.O_NOFOLLOW)
        self._fd: int | None = None

    def acquire(self, wait: bool = False) -> bool:
        while True:
            fd = os.open(self.path, self._flags, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                holder = self._name(fd)
                os.close(fd)
                raise self.refusal(holder) from None
            except OSError:  # a file system without locks: go on unlocked
                os.close(fd)
                return False
            # A lock file's previous holder removes it before it lets go (release), so the file
            # locked may be gone: then lock the one that is there now.
            with contextlib.suppress(FileNotFoundError):
                if not self.pid_file or os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    break
            os.close(fd)
        if self.pid_file:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def release(self) -> None:
        """Removes a lock file, then unlocks (in this order: see acquire)."""
        if self._fd is None:
            return
        if self.pid_file:
            self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None

    def holder(self) -> str | None:
        try:
            fd = os.open(self.path, (os.O_RDONLY if self.pid_file else os.O_RDONLY | os.O_DIRECTORY)
                         | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return self._name(fd)
        except OSError:
            return None
        finally:
            os.close(fd)  # also drops the shared lock just taken
        return None

    def _name(self, fd: int) -> str:
        """The holder's pid as its lock file records it, else "unknown"."""
        return (self.pid_file and os.read(fd, 32).decode(errors="replace").strip()) or "unknown"


_live: dict[str, LeaseLock] = {}  # the leases this process holds, by URL
_written: set[str] = set()  # the token of every lease this process has written
_verified: set[tuple[str, str, str]] = set()  # stores (scheme, bucket, endpoint) seen to enforce conditions
_registry = threading.Lock()


def busy_output(url: BucketPath, holder: str, seconds: float = LEASE_SECONDS) -> InputError:
    """The refusal of a bucket output whose lease another process holds."""
    return InputError(f"{url}: another process ({holder}) is writing it now (it holds {url}/{buckets.LEASE_KEY}); "
                      "wait for it to finish, or write to another output (a killed writer's lease expires within "
                      f"{seconds:g} s)")


def this_process_lease(url: BucketPath) -> LeaseLock | None:
    """The lease of `url` that this process holds now, or None."""
    with _registry:
        return _live.get(str(url))


class LeaseLock(Lock):
    """The lease object `url/.jepa-lease` (the module's description). `refusal(holder)` is the
    InputError when another process holds it (default `busy_output`); `seconds`, how long it outlives
    its last renewal."""

    def __init__(self, url: BucketPath, refusal: Callable[[str], InputError] | None = None,
                 seconds: float = LEASE_SECONDS) -> None:
        self.url = url
        self.refusal = refusal or (lambda holder: busy_output(url, holder, seconds))
        self.seconds = seconds
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self._store: Any = None
        self._generation: bytes | None = None  # of the lease as this process last wrote it; None unless held
        self._token = ""
        self._expires = 0.0  # unix seconds
        self._lost: str | None = None  # why the lease was lost, once it is
        self._swap = threading.Lock()  # one conditional write at a time: the renewing thread's or confirm's
        self._stop = threading.Event()
        self._renewing: threading.Thread | None = None

    def acquire(self, wait: bool = False) -> bool:
        store = buckets.open_store(self.url)
        while True:
            found = self._result(store.read(buckets.LEASE_KEY))
            record = _lease_record(found)
            if record is not None and record["expires"] > time.time() and record["token"] not in _stale_own():
                if not wait:
                    raise self.refusal(record["holder"])
                time.sleep(min(max(record["expires"] - time.time(), 0.0), POLL_SECONDS))
                continue
            token, expires = secrets.token_hex(16), time.time() + self.seconds
            with _registry:
                _written.add(token)
            written = self._write(store, token, expires, found.stamp.generation)
            if written:  # else another process wrote it between the read and the write: look again
                break
        self._store, self._generation, self._token, self._expires, self._lost = store, written, token, expires, None
        with _registry:
            _live[str(self.url)] = self
        try:
            self._verify_conditions(found.stamp.generation, "If-None-Match" if found.state != "value" else "If-Match")
        except BaseException:
            self.release()
            raise
        self._stop.clear()
        self._renewing = threading.Thread(target=self._renew_until_stopped, name=f"lease of {self.url}", daemon=True)
        self._renewing.start()
        return True

    def release(self) -> None:
        """Stops renewing, and deletes the lease if it is still this process's and has time left: on S3,
        TensorStore checks the generation with a request before the delete (S3 deletes conditionally
        only in directory buckets), and a lease near its expiry could be taken over in between, so it
        is left to expire. A store that cannot be reached leaves it to expire too (this process takes
        it over at once if it acquires it again)."""
        if self._generation is None:
            return
        self._stop.set()
        if self._renewing is not None:
            self._renewing.join()
        with self._swap:
            if self._lost is None and time.time() < self._expires - self.seconds * RENEW_EVERY:
                with contextlib.suppress(JepaError):  # unreachable: the lease expires by itself
                    self._result(self._store.write(buckets.LEASE_KEY, None, if_equal=self._generation))
            self._generation = None
        with _registry:
            if _live.get(str(self.url)) is self:
                del _live[str(self.url)]

    def holder(self) -> str | None:
        record = _lease_record(self._result(buckets.open_store(self.url).read(buckets.LEASE_KEY)))
        return record["holder"] if record is not None and record["expires"] > time.time() else None

    def confirm(self) -> None:
        """Renews the lease now (held LEASE_SECONDS more); InputError (one line) when it was lost or is
        not held, JepaError when the store cannot be reached."""
        if self._generation is None:
            raise InputError(f"{self.url}: this process does not hold its writer lease ({buckets.LEASE_KEY})")
        self._renew()
        if self._lost is not None:
            raise InputError(f"{self.url}: this process lost its writer lease ({self._lost}), so it publishes "
                             "nothing; run the command again")

    def _renew(self) -> None:
        """Swaps the lease for one that expires `seconds` from now, on the condition that it is still
        the generation written last; marks it lost when it is not, unless the object read back is this
        process's own (a swap whose answer was lost, then retried and refused)."""
        with self._swap:
            if self._lost is not None or self._generation is None:
                return
            for _ in range(2):
                expires = time.time() + self.seconds
                written = self._write(self._store, self._token, expires, self._generation)
                if written:
                    self._generation, self._expires = written, expires
                    return
                found = self._result(self._store.read(buckets.LEASE_KEY))
                record = _lease_record(found)
                if record is None or record["token"] != self._token:
                    self._lost = "it was removed" if record is None else \
                        f"{record['holder']} took it over after it expired"
                    return
                self._generation = found.stamp.generation

    def _renew_until_stopped(self) -> None:
        """The renewing thread: `_renew` every RENEW_EVERY of the lease until released or lost. A store
        that cannot be reached is tried again at the next renewal; the lease is lost once it expires."""
        while not self._stop.wait(self.seconds * RENEW_EVERY) and self._lost is None:
            try:
                self._renew()
            except JepaError as exc:
                if time.time() >= self._expires:
                    self._lost = f"it could not be renewed before it expired: {exc}"

    def _verify_conditions(self, read_generation: bytes, condition: str) -> None:
        """At the first lease on a store: checks that it enforces conditional writes. Writing the lease
        again on the acquisition's condition (`condition`, on the generation read before it) and, after
        a renewal, on the generation the renewal replaced (If-Match) must both fail; InputError (one
        line) when either succeeds."""
        store_id = (self.url.scheme, self.url.bucket, str(self.url.kvstore().get("endpoint", "")))
        with _registry:
            if store_id in _verified:
                return
        ignored = []
        with self._swap:
            again = self._write(self._store, self._token, self._expires, read_generation)
            if again:
                self._generation = again
                ignored.append(condition)
            replaced = self._generation
        self._renew()
        with self._swap:
            stale = self._write(self._store, self._token, self._expires, replaced)
            if stale:
                self._generation = stale
                ignored.append("If-Match")
        if ignored:
            raise InputError(f"{self.url}: the object store ignores conditional writes ({' and '.join(dict.fromkeys(ignored))}"
                             ": a write that had to fail succeeded), so it cannot give the writer-lock guarantee; use a "
                             "store that enforces them (AWS S3, GCS, or an S3-compatible server that honours "
                             "If-None-Match and If-Match on PUT)")
        with _registry:
            _verified.add(store_id)

    def _write(self, store: Any, token: str, expires: float, if_equal: bytes) -> bytes:
        """Writes this process's lease record on the condition that the object's generation is still
        `if_equal`; the new generation, or b"" when the condition failed."""
        record = {"holder": self.name, "token": token, "expires": round(expires, 3)}
        done = self._result(store.write(buckets.LEASE_KEY, json.dumps(record).encode(), if_equal=if_equal))
        return bytes(done.generation)

    def _result(self, future: Any) -> Any:
        """The result of a TensorStore future of a request to the store; its failure as one line."""
        try:
            return future.result()
        except ValueError as exc:
            raise failure(self.url, exc) from None


def _stale_own() -> set[str]:
    """The tokens of leases this process wrote and no longer holds (a release could not reach the store)."""
    with _registry:
        return _written - {lease._token for lease in _live.values()}


def _lease_record(found: Any) -> dict[str, Any] | None:
    """The lease a read found ({holder, token, expires}), or None when there is no object or it is not
    a lease (an object that does not parse holds no one)."""
    if found.state != "value":
        return None
    try:
        record = json.loads(found.value)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("token"), str) or \
            not isinstance(record.get("expires"), (int, float)) or isinstance(record.get("expires"), bool):
        return None
    return {"holder": str(record.get("holder", "unknown")), "token": record["token"],
            "expires": float(record["expires"])}


def make_lock(path: str | os.PathLike | BucketPath, refusal: Callable[[str], InputError] | None = None,
              pid_file: bool = False, follow_links: bool = True) -> Lock:
    """The lock of `path` for the storage it lies on: a LeaseLock for a bucket URL (`refusal` only),
    else a FlockLock (its arguments)."""
    where = location(path) if isinstance(path, (str, BucketPath)) else path
    if isinstance(where, BucketPath):
        return LeaseLock(where, refusal)
    return FlockLock(path, refusal, pid_file, follow_links)


@contextlib.contextmanager
def resumable_partial(partial: str | os.PathLike, final: Path | BucketPath) -> Iterator[Path]:
    """Holds the resumable partial directory `partial` of the output `final` (the `.NAME.partial/` of
    encode-latents and sample, kept across interruptions), created if needed, locked for the block. The
    lock goes when the process dies, so a later run resumes what a killed one left; a file system that
    cannot lock proceeds unlocked. InputError when a live process holds it: two writers never share one
    partial output. For an output in a bucket, whose partial lies in this host's staging folder, the
    block also holds the output's lease, so that no process on any host writes it meanwhile."""
    partial = Path(partial)
    refusal = InputError(f"{partial}: is not a partial output (a symbolic link or a file); remove it yourself "
                         "or write to another output")
    if partial.is_symlink() or (partial.exists() and not partial.is_dir()):
        raise refusal
    lock = make_lock(partial, follow_links=False, refusal=lambda holder: InputError(
        f"{final}: another process is writing it now (its partial output {partial} is in use); wait for it to "
        "finish, or write to another output"))
    with contextlib.ExitStack() as locked:
        if isinstance(final, BucketPath):  # its writer lease: one writer on any machine
            locked.enter_context(make_lock(final).held())
        with make_lock(partial.parent).held(wait=True):
            partial.mkdir(exist_ok=True)
            try:
                lock.acquire()
            except OSError:  # a link or a file that appeared since the check
                raise refusal from None
        try:
            yield partial
        finally:
            lock.release()
