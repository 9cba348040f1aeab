"""Mutation check: each declared one-line bug must make the tests named for it fail.

    python scripts/mutants.py [--only SUBSTRING] [--keep]

The repository (its working tree, without .git, .venv and caches) is copied once to a temporary
directory; each mutation is applied there to its one file, the named tests run against that copy
(PYTHONPATH and --rootdir point at it), and the file is restored before the next. The shared
working tree is never written. A mutation is "caught" when the tests fail, "survived" when they
pass. Prints one row per mutation and the score; exits 1 when under MIN_SCORE of the mutations are
caught, 2 when a declared original text does not occur exactly once in its file.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIN_SCORE = 0.9
TIMEOUT_S = 600  # one mutation's tests; a mutation that hangs them counts as caught (the tests did not pass)
IGNORED = shutil.ignore_patterns(".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", "*.egg-info",
                                 "demo", "build")


@dataclasses.dataclass(frozen=True)
class Mutation:
    file: str  # relative to the repository root
    original: str  # exact text, occurring once in the file
    mutated: str
    tests: tuple[str, ...]  # pytest node ids or test files, relative to the root
    what: str  # the bug, in a few words


M = Mutation
MUTATIONS: tuple[Mutation, ...] = (
    # -- named by the audit: each survived its related test file before its test was added
    M("jepa_cli/models/s5.py", "lam = jnp.minimum(self.lambda_re[...], LAMBDA_RE_MAX) + 1j",
      "lam = self.lambda_re[...] + 1j", ("tests/test_s5.py",), "Re(Lambda) not clipped below 0"),
)


def check_declared(root: Path = ROOT, mutations=MUTATIONS) -> list[str]:
    """One message per mutation whose original text does not occur exactly once in its file, or whose
    mutated text equals the original."""
    problems = []
    for m in mutations:
        path = root / m.file
        count = path.read_text().count(m.original) if path.is_file() else 0
        if count != 1:
            problems.append(f"{m.file}: {m.original!r} occurs {count} times (must be once)")
        if m.mutated == m.original:
            problems.append(f"{m.file}: the mutation of {m.original!r} changes nothing")
    return problems


def _drop_bytecode(path: Path) -> None:
    """Removes the cached bytecode of `path`: a mutated and a restored source of the same size written
    in the same second would otherwise read back each other's."""
    for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        pyc.unlink(missing_ok=True)


def run_tests(copy: Path, tests: tuple[str, ...]) -> tuple[bool, float]:
    """(passed, seconds) of the tests in the copy, one process, no xdist, no random order."""
    env = {**os.environ, "PYTHONPATH": str(copy)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # the copy's own bytecode cache keeps the runs after the first fast
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:randomly", "-n", "0", "--rootdir", str(copy),
               "-p", "no:cacheprovider", *tests]
    start = time.monotonic()
    try:
        result = subprocess.run(command, cwd=copy, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                timeout=TIMEOUT_S)
        passed = result.returncode == 0
    except subprocess.TimeoutExpired:
        passed = False
    return passed, time.monotonic() - start


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="run the mutations whose file or description holds this text")
    parser.add_argument("--keep", action="store_true", help="leave the temporary copy in place (its path is printed)")
    args = parser.parse_args(argv)
    problems = check_declared()
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    chosen = [m for m in MUTATIONS if args.only is None or args.only in m.file or args.only in m.what]
    start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="jepa-mutants-"))
    copy = work / "repo"
    shutil.copytree(ROOT, copy, ignore=IGNORED, symlinks=True)
    rows = []
    try:
        # every named test passes on the unmutated copy, or no verdict below would mean anything
        targets = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        passed, seconds = run_tests(copy, targets)
        print(f"unmutated: {'pass' if passed else 'FAIL'} in {seconds:.0f} s ({len(targets)} test targets)", flush=True)
        if not passed:
            print("the named tests fail without a mutation; fix them first", file=sys.stderr)
            return 2
        for i, m in enumerate(chosen, 1):
            path = copy / m.file
            original = path.read_text()
            path.write_text(original.replace(m.original, m.mutated, 1))
            _drop_bytecode(path)
            try:
                passed, seconds = run_tests(copy, m.tests)
            finally:
                path.write_text(original)
                _drop_bytecode(path)
            verdict = "survived" if passed else "caught"
            rows.append((m, verdict, seconds))
            print(f"[{i}/{len(chosen)}] {verdict:<8} {seconds:6.1f}s  {m.file}: {m.what}", flush=True)
    finally:
        if args.keep:
            print(f"the copy: {copy}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    caught = sum(verdict == "caught" for _, verdict, _ in rows)
    score = caught / len(rows) if rows else 1.0
    print()
    print(f"{'verdict':<9}{'file':<42}mutation")
    for m, verdict, _ in rows:
        print(f"{verdict:<9}{m.file:<42}{m.what}")
    print(f"\n{caught} of {len(rows)} mutations caught ({100 * score:.0f} %) in {time.monotonic() - start:.0f} s")
    return 0 if score >= MIN_SCORE else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
