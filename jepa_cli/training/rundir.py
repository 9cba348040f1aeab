"""RUN on disk for the trainer: what it may write into (a new, resumed or replaced run), the lock
process 0 holds, the disk space it keeps for its last word, metrics.jsonl cut back on resume, and the
cleanup after the file system refused a write."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from jepa_cli.data.files import read_jsonl, replace_file
from jepa_cli.errors import InputError
from jepa_cli.training.config import TrainConfig
from jepa_cli.training.runfiles import (LOCK_FILE, METRICS_FILE, RUN_FILE, busy_run, checkpoint_steps, run_lock,
                                        run_identity, write_run)


def check_run_dir(out: Path, resume: bool, force: bool, locked: bool = False) -> str:
    """'new', 'resume' or 'force'; refuses to write into an existing RUN otherwise.

    A run with no complete checkpoint (stopped by a crash or an error before its first save) holds
    nothing to resume or to lose: it is 'new' and is overwritten without --force. A run a live
    process trains in is refused whatever the flags; so is a symbolic link, unless resumed (a new
    or replaced run is never written through a link into the folder it names). `locked`: this
    process holds RUN's lock itself."""
    if out.is_symlink() and not resume:
        raise InputError(f"{out}: is a symbolic link; give the folder it points to as --out, or another --out")
    if not out.exists():
        if not out.parent.exists():
            raise InputError(f"{out.parent}: output directory does not exist")
        return "new"
    if not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory")
    holder = None if locked else run_lock(out).holder()
    if holder is not None:
        raise busy_run(out, holder)
    if not any(p.name != LOCK_FILE for p in out.iterdir()):
        return "new"
    if not (out / RUN_FILE).exists():
        raise InputError(f"{out}: exists and is not a training run (refusing to write into it)")
    if not checkpoint_steps(out):
        check_checkpoints_replaceable(out)  # cleared as a new run
        return "new"
    if resume:
        return "resume"
    if force:
        check_checkpoints_replaceable(out)
        return "force"
    raise InputError(f"{out}: already holds a run (use --resume to continue it or --force to replace it)")


_CHECKPOINT_ENTRY = re.compile(r"[0-9]+(\.orbax-checkpoint-tmp.*)?")  # a step and orbax's partial of one

def check_checkpoints_replaceable(out: Path) -> None:
    """--force deletes RUN/checkpoints whole: refused, naming it, when it holds anything but the step
    folders the trainer saved (and orbax's temporary folders of steps), e.g. a file of the user's."""
    folder = out / "checkpoints"
    if folder.is_symlink():
        raise InputError(f"{folder}: is a symbolic link, which jepa train does not write; --force replaces only "
                         "what jepa wrote: remove it yourself, or choose another --out")
    for entry in sorted(folder.iterdir()) if folder.is_dir() else ():
        if entry.is_symlink() or not entry.is_dir() or not _CHECKPOINT_ENTRY.fullmatch(entry.name):
            raise InputError(f"{out}: holds {entry}, which jepa train did not write; --force replaces only what "
                             "jepa wrote: move it out first, or choose another --out")

def check_outputs(config: TrainConfig) -> None:
    """RUN and the --tensorboard folder may not be, contain or lie inside an input (the dataset, the
    --probe-data sets): a --force would delete the dataset's files, event files would mix into it. An
    existing --tensorboard that is not a folder is refused here, before RUN is created."""
    from jepa_cli.data import atomic

    inputs = [config.data]
    if config.probe_data:
        inputs += [p.strip() for p in config.probe_data.split(",") if p.strip()]
    atomic.check_disjoint(config.out, inputs)
    if config.tensorboard:
        atomic.check_disjoint(config.tensorboard, inputs)
        board = Path(config.tensorboard)
        try:
            os.stat(board)  # a name too long, a file as a folder on the way: an OSError the CLI reports in one line
        except FileNotFoundError:  # created at the first row; its nearest existing folder must take it
            folder = next(p for p in board.absolute().parents if p.exists())
            if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
                raise InputError(f"{board}: cannot create the --tensorboard folder in {folder} "
                                 "(not a writable folder)") from None
        else:
            if not board.is_dir():
                raise InputError(f"{board}: --tensorboard names a file, not a folder; choose a folder for the "
                                 "event files")

RUN_MODES = ("new", "resume", "force")  # what check_run_dir finds

def lock_run(out: Path, main: bool, planned: str, resume: bool, force: bool,
             seen: tuple[int, int, int] | None) -> tuple[Any, str]:
    """Process 0 creates RUN if needed, locks it (runfiles.run_lock) and, holding the lock, checks RUN
    again (`check_run_dir`: another trainer may have written it since `make_plan` looked, finding
    the mode `planned` and the run.json `seen`, run.run_identity): a run resumed or replaced must be
    the one the user was shown, not one another process wrote meanwhile.
    Returns (the lock, or None on the other processes, the mode). The other processes never write,
    lock or look: they learn process 0's mode, or that it stopped, from one broadcast. Why one look
    for all: a process that looked for itself could find the run.json process 0 had just written,
    refuse the run and leave process 0 waiting for it at orbax's first barrier, forever."""
    import jax

    lock, error, mode = None, None, planned
    if main:
        try:
            out.mkdir(exist_ok=True)
            lock = run_lock(out)
            lock.acquire()
            mode = check_run_dir(out, resume, force, locked=True)
            if mode != planned and mode != "new" or mode != "new" and run_identity(out) != seen:
                raise InputError(f"{out}: another process wrote a run here meanwhile; check it, then rerun")
        except InputError as exc:
            error = exc
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        code = int(multihost_utils.broadcast_one_to_all(np.int32(-1 if error else RUN_MODES.index(mode))))
        if code < 0 and error is None:
            error = InputError(f"{out}: process 0 could not lock or check the run (see its error)")
        mode = RUN_MODES[max(code, 0)]
    if error is not None:
        if lock is not None:
            lock.release()
        raise error
    return lock, mode


def start_writing(out: Path, mode: str, record: dict[str, Any], start_step: int) -> None:
    """Process 0's first writes into RUN: a new or replaced run (`mode` 'new' or 'force'; 'new' may be
    a run that never saved a checkpoint) is cleared and starts over; run.json is written, metrics.jsonl
    cut back to `start_step` and the reserve taken."""
    if mode in ("new", "force"):
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
        for name in (METRICS_FILE, RUN_FILE):
            (out / name).unlink(missing_ok=True)
    write_run(out, record)
    truncate_metrics(out / METRICS_FILE, start_step)
    reserve(out / RESERVE_FILE)


def storage_stop(out: Path, record: dict[str, Any], held: Any, failure: str, main: bool) -> InputError:
    """After the file system refused a write (`failure`, one line naming the path): closes the
    checkpoint manager (`held.ckpts`), removes the checkpoints this trainer left half-written (of the
    saves in `held.saving`; which also frees the room run.json needs), marks run.json (`record`)
    `failed at step N` (`held.step`) with the error, and returns the error to raise, naming the last
    good checkpoint. Complete checkpoints are never touched: --resume continues."""
    from jepa_cli.training.abandoned_reads import settle_abandoned_reads_at_exit

    settle_abandoned_reads_at_exit()
    if held.ckpts is not None:
        with contextlib.suppress(Exception):
            held.ckpts.close()
        with contextlib.suppress(Exception):
            held.ckpts.manager.close()  # when close() stopped at the failed write it waited for
    # orbax names a file inside the temporary folder of the step it wrote, removed below: name the step
    partial = re.match(re.escape(str((out / "checkpoints").resolve())) + r"/(\d+)\.orbax-checkpoint-tmp[^:]*: (.*)",
                       failure)
    if partial:
        failure = f"{out / 'checkpoints' / partial.group(1)}: {partial.group(2)}"
    complete = checkpoint_steps(out)
    if main:
        (out / RESERVE_FILE).unlink(missing_ok=True)
        for step in set(held.saving) - set(complete):
            for partial in (out / "checkpoints").glob(f"{step}.orbax-checkpoint-tmp*"):
                shutil.rmtree(partial, ignore_errors=True)
        with contextlib.suppress(OSError):  # the disk may still be too full for it: the error line says why
            write_run(out, {**record, "status": f"failed at step {held.step}", "error": failure})
    kept = f"the last good checkpoint is step {complete[-1]}" if complete else "no checkpoint was saved"
    return InputError(f"{failure}; training stopped at step {held.step}, {kept} in {out}; fix that, then "
                      "continue with --resume")


# RUN/.reserve: disk space held while training, given back when a write fails, so that run.json can
# still say the run failed on a disk that filled up meanwhile (its rewrite needs a new block)
RESERVE_FILE = ".reserve"
RESERVE_BYTES = 64 << 10


def reserve(path: Path) -> None:
    """Allocates RESERVE_BYTES of disk to `path` (posix_fallocate where the file system has it)."""
    with open(path, "wb") as f:
        try:
            os.posix_fallocate(f.fileno(), 0, RESERVE_BYTES)
        except (AttributeError, OSError) as exc:
            if isinstance(exc, OSError) and exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            f.write(bytes(RESERVE_BYTES))  # a file system without fallocate: written zeros hold the blocks

def truncate_metrics(path: Path, step: int) -> None:
    """On resume, drops the rows logged after the checkpoint training continues from (and any line
    that is not a row, such as one cut short by a kill), so that no step is listed twice. The file
    is replaced atomically: a kill meanwhile leaves the old file or the new one."""
    if not path.exists():
        return
    keep = []
    for line, row in read_jsonl(path):
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
            keep.append(line)
    replace_file(path, "".join(k + "\n" for k in keep).encode())
