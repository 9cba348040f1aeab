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
# the pure tests of the k-NN figures and of FD (the file's other tests train and sample runs)
FD = ("tests/test_adversarial_sample_fd.py::test_precision_recall_density_and_coverage_count_samples_inside_knn_balls",
      "tests/test_adversarial_sample_fd.py::test_a_sample_exactly_on_a_balls_edge_lies_inside_it",
      "tests/test_adversarial_sample_fd.py::test_the_four_figures_match_their_definitions_on_random_sets_each_with_its_own_default_k",
      "tests/test_adversarial_sample_fd.py::test_fd_gram_and_covariance_methods_give_the_same_distance")
GOLDEN = "tests/test_golden_ijepa.py"
MASKS = "tests/test_masks.py"

MUTATIONS: tuple[Mutation, ...] = (
    # -- named by the audit: each survived its related test file before its test was added
    M("jepa_cli/models/s5.py", "lam = jnp.minimum(self.lambda_re[...], LAMBDA_RE_MAX) + 1j",
      "lam = self.lambda_re[...] + 1j", ("tests/test_s5.py",), "Re(Lambda) not clipped below 0"),
    M("jepa_cli/evaluation/fd.py", "queries, q_norms) <= radii[a:a + rows, None]", "queries, q_norms) < radii[a:a + rows, None]",
      FD, "a point on a k-NN ball's edge left outside"),
    M("jepa_cli/models/torch_writer.py", "(value.bit_length() + 8) // 8", "(value.bit_length() + 7) // 8",
      ("tests/test_export.py::test_integers_of_every_width_read_back_through_pythons_own_unpickler",
       "tests/test_export.py::test_the_writer_keeps_plain_values_and_every_storage_dtype"),
      "LONG1 without room for the sign bit"),
    M("jepa_cli/training/export_official.py", "epoch = step // ipe if ipe > 0 else 0",
      "epoch = -(-step // ipe) if ipe > 0 else 0",
      ("tests/test_export.py::test_the_epoch_written_counts_whole_epochs_of_a_step_between_two",
       "tests/test_export.py::test_the_export_of_an_imported_official_checkpoint_holds_its_tensors"),
      "exported epoch rounded up"),
    M("jepa_cli/api.py", "bad = int(np.count_nonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1)))", "bad = 0",
      ("tests/test_adversarial_api.py",), "encode takes samples holding NaN or inf"),
    M("jepa_cli/evaluation/encode.py", "    if bad:\n        raise InputError(f\"{encoder_name} gives",
      "    if False:\n        raise InputError(f\"{encoder_name} gives", ("tests/test_adversarial_api.py",),
      "non-finite embeddings returned"),
    M("jepa_cli/api.py", "if labels.shape[:1] != inputs.shape[:1]:", "if len(labels) > len(inputs):",
      ("tests/test_adversarial_api.py",), "too few labels accepted by load_dataset"),
    M("jepa_cli/evaluation/run_table.py", 'dirs[:] = sorted(d for d in dirs if not d.startswith("."))',
      "dirs[:] = sorted(dirs)", ("tests/test_runs.py",), "jepa runs enters dot-folders"),
    M("jepa_cli/data/splits.py", "        chosen.pop()\n", "        pass\n", ("tests/test_ingest_groups.py",),
      "every group may go to test"),
    M("jepa_cli/data/jsonvalues.py", "if isinstance(value, (list, tuple)):", "if isinstance(value, list):",
      ("tests/test_ingest.py::test_nan_and_infinity_inside_tuples_and_lists_become_null_in_a_description",),
      "NaN inside a tuple kept in a description"),
    M("jepa_cli/cli/common.py", "return boundary or now + pace >= deadline", "return boundary and now + pace >= deadline",
      ("tests/test_progress_plain_rate.py",), "plain progress throttled by tenth and time both"),
    M("jepa_cli/training/schedules.py", "return float(max(1, int(round(float(ramp_epochs) * int(ipe)))))",
      "return float(max(1, int(float(ramp_epochs) * int(ipe))))", ("tests/test_ema_ramp.py",),
      "EMA ramp epochs x ipe truncated"),
    M("jepa_cli/evaluation/encode.py", 'return z.mean(axis=1) if pool == "mean" else z',
      'return z.max(axis=1) if pool == "mean" else z', ("tests/test_api.py",), "mean pooling takes the max"),
    M("jepa_cli/data/transforms.py", "    std = np.asarray(std, np.float32) * 255.0\n",
      "    std = np.asarray(std, np.float32)\n",
      ("tests/test_training_cli.py::test_pixels_normalised_on_the_device_and_on_the_host_are_x_over_255_less_the_mean_over_the_std",),
      "pixels divided by the std in [0, 1] units"),
    M("jepa_cli/objectives/telemetry.py", "cov = zc.T @ zc / max(z.shape[0] - 1, 1)", "cov = zc.T @ zc / max(z.shape[0], 1)",
      ("tests/test_anticollapse.py",), "batch covariance with ddof 0"),
    # -- more one-line bugs across the code
    M("jepa_cli/evaluation/fd.py", "out[a:a + rows] = np.partition(d, k, axis=1)[:, k]",
      "out[a:a + rows] = np.partition(d, k - 1, axis=1)[:, k - 1]", FD, "k-NN radius to the (k-1)-th neighbour"),
    M("jepa_cli/evaluation/fd.py", '"density": int(held.sum()) / (k * len(fake))', '"density": int(held.sum()) / len(fake)',
      FD, "density not divided by k"),
    M("jepa_cli/evaluation/fd.py", '"precision": float(np.mean(in_real > 0))', '"precision": float(np.mean(in_real > 1))',
      FD, "precision needs two balls"),
    M("jepa_cli/evaluation/fd.py", "tr_sqrt = float(np.sum(np.sqrt(np.clip(eig, 0.0, None))))",
      "tr_sqrt = float(np.sum(np.clip(eig, 0.0, None)))", FD, "FD's trace term without the square root"),
    M("jepa_cli/evaluation/fd.py", "fa.T @ fa / (n_a - 1), mu_b", "fa.T @ fa / n_a, mu_b", FD,
      "FD covariance with ddof 0"),
    M("jepa_cli/training/schedules.py", "warm_lr = start_lr + (t / warm) * (ref_lr - start_lr)",
      "warm_lr = start_lr + ((t - 1.0) / warm) * (ref_lr - start_lr)", (GOLDEN,), "LR warmup one update late"),
    M("jepa_cli/training/schedules.py", "jnp.cos(math.pi * t / t_max)", "jnp.cos(math.pi * (t - 1.0) / t_max)",
      (GOLDEN,), "weight decay schedule one update late"),
    M("jepa_cli/objectives/ijepa.py", "return jnp.minimum(m, ema1) if ema1 >= ema0 else jnp.maximum(m, ema1)",
      "return m", ("tests/test_objective_ijepa.py::test_ema_momentum_follows_the_linear_ramp", GOLDEN),
      "EMA momentum not clipped at its end value"),
    M("jepa_cli/objectives/ijepa.py", "return jnp.sum(per_token * w) / jnp.maximum(jnp.sum(w), 1.0)",
      "return jnp.sum(per_token * w) / w.size",
      (GOLDEN, "tests/test_objective_ijepa.py::test_loss_equals_its_definition_on_hand_masks"),
      "loss averaged over padded tokens too"),
    M("jepa_cli/objectives/ijepa.py", "return jnp.where(a < 1.0, 0.5 * d * d, a - 0.5)",
      "return jnp.where(a < 1.0, 0.5 * d * d, a - 1.0)", (GOLDEN,), "smooth L1 not continuous at 1"),
    M("jepa_cli/models/layers.py", "NORM_EPS = 1e-6", "NORM_EPS = 1e-5", (GOLDEN,), "LayerNorm eps of timm's default"),
    M("jepa_cli/models/s5.py", "r = np.sqrt(n + 0.5)", "r = np.sqrt(n + 1.0)", ("tests/test_s5.py",),
      "HiPPO-N low-rank term"),
    M("jepa_cli/data/splits.py", "chosen = rng.permutation(members)[: int(round(len(members) * test_fraction))]",
      "chosen = rng.permutation(members)[: int(len(members) * test_fraction)]",
      ("tests/test_ingest.py::test_split_indices_are_disjoint_and_cover_every_sample",),
      "class share of test truncated"),
    M("jepa_cli/data/labels.py", "(values.min() < info.min or values.max() > info.max)", "(values.min() < info.min)",
      ("tests/test_adversarial_api.py",), "labels above int32 wrap"),
    M("jepa_cli/data/atomic.py", "make_lock(entry).held() as locked", "contextlib.nullcontext(True) as locked",
      ("tests/test_store.py",), "a live writer's partial removed"),
    M("jepa_cli/data/resources.py", "while abs(n) >= 1024 and", "while abs(n) > 1024 and", ("tests/test_store.py",),
      "1024 bytes shown as 1024 B"),
    M("jepa_cli/masks/random.py", "keep = jnp.floor(n * (1 - ratio)).astype(jnp.int32)",
      "keep = jnp.ceil(n * (1 - ratio)).astype(jnp.int32)", (MASKS,), "random mask keeps one more patch"),
    M("jepa_cli/masks/multiblock.py", "(rows >= top) & (rows < top + h)", "(rows >= top) & (rows <= top + h)", (MASKS,),
      "multiblock block one row taller"),
    M("jepa_cli/masks/multiblock.py", "block.sum() > config.min_keep", "block.sum() >= config.min_keep", (MASKS,),
      "context of min_keep patches accepted"),
    M("jepa_cli/masks/sizes.py", "h, w = min(h, H - 1), min(w, W - 1)", "h, w = min(h, H), min(w, W)", (MASKS,),
      "I-JEPA blocks as large as the grid"),
    M("jepa_cli/cli/common.py", "return (total - done) * (now - first[1]) / timed if timed > 0 else None",
      "return (total - done) * (now - first[1]) / done if timed > 0 else None", ("tests/test_progress_plain_rate.py",),
      "ETA counts the untimed first batch"),
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


def _env(copy: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(copy)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # the copy's own bytecode cache keeps the runs after the first fast
    return env


def imports_from(copy: Path) -> bool:
    """Whether `jepa_cli` imports from the copy (not from the editable install of the working tree)."""
    found = subprocess.run([sys.executable, "-c", "import jepa_cli; print(jepa_cli.__file__)"], cwd=copy,
                           env=_env(copy), capture_output=True, text=True).stdout.strip()
    return Path(found).resolve().is_relative_to(copy.resolve())


def run_tests(copy: Path, tests: tuple[str, ...]) -> tuple[bool, float, str]:
    """(passed, seconds, the output's last lines) of the tests in the copy, one process, no xdist, no
    random order."""
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:randomly", "-n", "0", "--rootdir", str(copy),
               "-p", "no:cacheprovider", *tests]
    start = time.monotonic()
    try:
        result = subprocess.run(command, cwd=copy, env=_env(copy), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", timeout=TIMEOUT_S)
        passed, output = result.returncode == 0, result.stdout
    except subprocess.TimeoutExpired:
        passed, output = False, f"timed out after {TIMEOUT_S} s"
    return passed, time.monotonic() - start, "\n".join(output.splitlines()[-30:])


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
        if not imports_from(copy):
            print(f"jepa_cli does not import from the copy {copy}; nothing run", file=sys.stderr)
            return 2
        # every named test passes on the unmutated copy, or no verdict below would mean anything
        targets = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        passed, seconds, output = run_tests(copy, targets)
        print(f"unmutated: {'pass' if passed else 'FAIL'} in {seconds:.0f} s ({len(targets)} test targets)", flush=True)
        if not passed:
            print(f"{output}\nthe named tests fail without a mutation; fix them first", file=sys.stderr)
            return 2
        for i, m in enumerate(chosen, 1):
            path = copy / m.file
            original = path.read_text()
            path.write_text(original.replace(m.original, m.mutated, 1))
            _drop_bytecode(path)
            try:
                passed, seconds, _ = run_tests(copy, m.tests)
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
