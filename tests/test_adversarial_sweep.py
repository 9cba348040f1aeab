"""A hostile sweep over every command, in-process: missing, empty, foreign, corrupt, unicode and over-long
paths in every input position, and out-of-range or unparsable numbers in every numeric option. Each case
ends in exit 0 or in exactly one `jepa: error:` line with exit 2, never a traceback, and no case changes
an input on disk."""

from __future__ import annotations

import os
import shutil

import pytest
from click.testing import CliRunner

from adversarial import snapshot
from test_encode import image_dataset

pytestmark = pytest.mark.slow

TOY = ["--objective", "toy_objective:make", "--batch-size", "8", "--mesh", "data=1"]
INPUTS = ("missing", "empty", "text", "junkdir", "corrupt", "badjson", "unicode", "long")
NUMBERS = ("-1", "0", "1e30", "nan", "inf", "abc", "99999999999999999999")


def _input_cases() -> list[list[str]]:
    cases = []
    for bad in INPUTS:
        b = "{%s}" % bad
        cases += [["info", b], ["info", b, "--json"], ["ema-inspect", b],
                  ["encode-latents", b, "{data}", "-o", "{out}"], ["encode-latents", "{run}", b, "-o", "{out}"],
                  ["probe", "linear", b, "{emb}"], ["probe", "knn", "{emb}", b], ["probe", "knn", b, b, "--raw"],
                  ["fd", b, "{data}"], ["fd", "{data}", "{data}", "--run", b], ["sample", b, "-n", "2", "-o", "{out}"],
                  ["plot", b, "-o", "{out}.png"], ["train", *TOY, "--data", b, "--out", "{out}", "--steps", "1"],
                  ["train", *TOY, "--data", "{data}", "--out", b, "--steps", "1", "--resume"],
                  ["import-checkpoint", b, "-o", "{out}"], ["ingest", b, "{out}"]]
    return cases


def _number_cases() -> list[list[str]]:
    cases = []
    for n in NUMBERS:
        cases += [["mask", "--grid", f"{n}x8"], ["mask", "--grid", "8x8", "--batch-size", n],
                  ["mask", "--grid", "8x8", "--pred-scale", f"{n},0.2"],
                  ["train", *TOY, "--data", "{data}", "--out", "{out}", "--steps", n],
                  ["train", *TOY, "--data", "{data}", "--out", "{out}", "--steps", "1", "--lr", n],
                  ["train", *TOY, "--data", "{data}", "--out", "{out}", "--steps", "1", "--warmup-steps", n],
                  ["probe", "knn", "{emb}", "{emb}", "--k", n],
                  ["encode-latents", "{run}", "{data}", "-o", "{out}", "--batch-size", n],
                  ["ingest", "builtin:digits", "{out}", "--size", f"{n}x8"], ["ingest", "builtin:digits", "{out}", "--limit", n],
                  ["ingest", "builtin:digits", "{out}", "--test-fraction", n, "--split", "train"],
                  ["ema-inspect", "{run}", "--step", n], ["fd", "{data}", "{data}", "--k", n],
                  ["probe", "knn", "{emb}", "{emb}", "--run", "{run}", "--step", n]]
    return cases


OTHER_CASES = [["train", "--objective", "nope"], ["train", *TOY, "--data", "{data}", "--out", "{data}", "--steps", "1"],
               ["encode-latents", "{run}", "{data}", "-o", "{data}"], ["encode-latents", "{run}", "{data}", "-o", "{run}"],
               ["ingest", "{data}", "{data}"], ["completion", "tcsh"], ["mask", "--strategy", "nope"],
               ["probe", "nope", "{emb}", "{emb}"], ["plot", "{run}", "-o", "{data}"], ["sample", "{run}", "-n", "2", "-o", "{out}"],
               ["fd", "{emb}", "{data}"]]
CASES = _input_cases() + _number_cases() + OTHER_CASES


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A dataset, a 2-update toy run, its embeddings, and files that are not what a command expects."""
    from jepa_cli.cli.main import cli

    root = tmp_path_factory.mktemp("sweep")
    data = image_dataset(root / "data.zarr", n=40, size=8, seed=0)
    run, emb = root / "run", root / "emb.zarr"
    for args in (["train", *TOY, "--data", str(data), "--out", str(run), "--steps", "2", "-q"],
                 ["encode-latents", str(run), str(data), "-o", str(emb), "-q"]):
        assert CliRunner().invoke(cli, args, catch_exceptions=False).exit_code == 0
    (root / "empty").write_bytes(b"")
    (root / "text.txt").write_text("hello\n")
    (root / "junkdir").mkdir()
    (root / "junkdir" / "x.bin").write_bytes(os.urandom(100))
    corrupt = root / "corrupt.zarr"
    shutil.copytree(data, corrupt)
    chunk = next(f for f in sorted((corrupt / "inputs").rglob("*")) if f.is_file() and f.name != "zarr.json")
    chunk.write_bytes(chunk.read_bytes()[: chunk.stat().st_size // 2])
    badjson = root / "badjson.zarr"
    shutil.copytree(data, badjson)
    (badjson / "zarr.json").write_text("{not json")
    (root / "outs").mkdir()
    paths = {"missing": root / "nope.zarr", "empty": root / "empty", "text": root / "text.txt", "junkdir": root / "junkdir",
             "corrupt": corrupt, "badjson": badjson, "unicode": root / "dätä ✓.zarr", "long": root / ("x" * 300),
             "data": data, "run": run, "emb": emb}
    return root, {name: str(path) for name, path in paths.items()}


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c)[:80] for c in CASES])
def test_a_hostile_case_exits_0_or_with_one_error_line_and_changes_no_input(workspace, case):
    from jepa_cli.cli.main import cli

    root, paths = workspace
    args = [arg.format(out=str(root / "outs" / f"o{CASES.index(case)}"), **paths) for arg in case]
    guard = [paths[name] for name in ("data", "run", "emb", "corrupt", "badjson", "text", "empty")]
    before = snapshot(guard)
    result = CliRunner().invoke(cli, args, catch_exceptions=False, prog_name="jepa")
    lines = result.stderr.strip().splitlines()
    assert result.exit_code in (0, 2), result.stderr
    if result.exit_code == 2:
        assert len(lines) == 1 and lines[0].startswith("jepa: error: "), result.stderr
    assert "Traceback" not in result.stderr
    assert snapshot(guard) == before
