"""The hostile-user harness: runs the real `jepa` CLI in a subprocess and checks that a
refusal is exactly one `jepa: error:` line, with the expected exit code and no traceback, and that
nothing it was handed (inputs, earlier outputs, the whole working folder) changed on disk.

The subprocess sees one CPU device (the suite's own process simulates 8; a case that needs more
passes its own XLA_FLAGS): `jepa` then keeps its compilation cache (JEPA_CACHE_DIR), so the many
runs of the same tiny model compile once.

Test modules named `test_adversarial_*.py` hold the cases, one behaviour each:

    def test_ingest_into_its_own_source_is_refused(tmp_path):
        ...
        expect_refusal("ingest", src, src, "--force", guard=[tmp_path], fragments=[str(src)])
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable, Sequence

from conftest import COMPILE_FASTER

ROOT = Path(__file__).resolve().parents[1]


def snapshot(paths: Iterable[str | os.PathLike]) -> dict[str, tuple]:
    """Every file and directory under `paths` (hidden ones included): kind, size and SHA-256 of files.

    Equal snapshots mean nothing was created, removed or changed there."""
    out: dict[str, tuple] = {}
    for top in map(Path, paths):
        if not top.exists() and not top.is_symlink():
            out[str(top)] = ("missing",)
            continue
        entries = [top] + (sorted(top.rglob("*")) if top.is_dir() and not top.is_symlink() else [])
        for entry in entries:
            if entry.is_symlink():
                out[str(entry)] = ("link", os.readlink(entry))
            elif entry.is_dir():
                out[str(entry)] = ("dir",)
            else:
                out[str(entry)] = ("file", entry.stat().st_size, hashlib.sha256(entry.read_bytes()).hexdigest())
    return out


def jepa_env(env: dict | None = None) -> dict[str, str]:
    """The environment of a `jepa` subprocess: the suite's, on one CPU device, with this checkout
    importable and JEPA_DEBUG unset (a traceback would hide a missing error line); `env` wins."""
    full_env = {**os.environ, "XLA_FLAGS": COMPILE_FASTER, **(env or {})}
    full_env.pop("JEPA_DEBUG", None)
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full_env.get("PYTHONPATH")]))
    return full_env


def run_jepa(*args: str | os.PathLike, cwd: str | os.PathLike | None = None, env: dict | None = None,
             timeout: float = 300, input: bytes | None = None) -> subprocess.CompletedProcess:
    """`python -m jepa_cli ARGS...` in a fresh process (the real CLI: signals, exit codes, stderr)."""
    return subprocess.run([sys.executable, "-m", "jepa_cli", *map(str, args)], cwd=cwd, env=jepa_env(env),
                          capture_output=True, timeout=timeout, input=input)


# `jepa ARGS` with one function wrapped so that, before or after it runs, the process touches a marker file
# and waits (300 s, or until `release_held`): a signal sent once the marker exists lands at that point,
# whatever the machine's speed.
HELD = """
import importlib, pathlib, sys, time
marker, module, attribute, when = pathlib.Path(sys.argv[1]), *sys.argv[2:5]
owner_path, _, name = attribute.rpartition(".")
owner = importlib.import_module(module)
for part in filter(None, owner_path.split(".")):
    owner = getattr(owner, part)
real = getattr(owner, name)
go = marker.with_name(marker.name + ".go")
def held(*args, **kwargs):
    out = real(*args, **kwargs) if when == "after" else None
    marker.touch()
    deadline = time.monotonic() + 300
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return out if when == "after" else real(*args, **kwargs)
setattr(owner, name, held)
sys.argv[1:] = sys.argv[5:]
from jepa_cli.cli.main import main
main()
"""


def start_held(marker: Path, target: str, when: str, *args: str | os.PathLike) -> subprocess.Popen:
    """Starts `jepa ARGS` held `when` ('before' or 'after') `target` ('module:attribute', e.g.
    'jepa_cli.data.resumable:mark_unit') first runs; returns once `marker` exists, the process waiting there."""
    module, attribute = target.split(":")
    process = subprocess.Popen([sys.executable, "-c", HELD, str(marker), module, attribute, when, *map(str, args)],
                               env=jepa_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while not marker.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"jepa {' '.join(map(str, args))} never reached {target}: {process.communicate()}")
        time.sleep(0.02)
    return process


def release_held(marker: Path) -> None:
    """Lets a process that `start_held` holds at `marker` go on at once."""
    marker.with_name(marker.name + ".go").touch()


def assert_one_error_line(result: subprocess.CompletedProcess, code: int = 2,
                          fragments: Sequence[str] = ()) -> str:
    """Exit `code`, stderr exactly one line `jepa: error: ...` naming every fragment; returns the line."""
    stderr = result.stderr.decode("utf-8", "replace")
    assert result.returncode == code, (result.returncode, stderr, result.stdout[-2000:])
    assert "Traceback" not in stderr, stderr
    lines = stderr.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    assert len(lines) == 1, f"stderr is not one line: {stderr!r}"
    assert lines[0].startswith("jepa: error: "), lines[0]
    for fragment in fragments:
        assert str(fragment) in lines[0], (fragment, lines[0])
    return lines[0]


def expect_refusal(*args: str | os.PathLike, guard: Iterable[str | os.PathLike] = (), code: int = 2,
                   fragments: Sequence[str] = (), cwd: str | os.PathLike | None = None,
                   env: dict | None = None, timeout: float = 300) -> str:
    """Runs `jepa ARGS`; asserts one error line (exit `code`, naming `fragments`) and that every
    path in `guard` is byte-for-byte as before. Returns the error line."""
    guard = list(guard)
    before = snapshot(guard)
    result = run_jepa(*args, cwd=cwd, env=env, timeout=timeout)
    line = assert_one_error_line(result, code, fragments)
    after = snapshot(guard)
    changed = sorted(set(before.items()) ^ set(after.items()))
    assert not changed, f"refused command changed guarded paths: {changed[:10]}"
    return line


def damage_checkpoint(run: str | os.PathLike, step: int) -> None:
    """Cuts every data file of RUN's checkpoint `step` (its state) in half, as a full disk or a bad copy would."""
    for path in (Path(run) / "checkpoints" / str(step) / "state").rglob("*"):
        if path.is_file() and path.parent.name == "d":
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
