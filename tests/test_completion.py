"""Shell completion driven as bash drives it: the committed script's function, COMP_WORDS/COMP_CWORD,
and the `jepa` on PATH answering. It knows runs, datasets, checkpoint steps, builtins and choices."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def bash_complete(line: str, cwd: Path) -> list[str]:
    """COMPREPLY after <TAB> at the end of `line` (a trailing space completes a new word). As bash
    does with ':' in COMP_WORDBREAKS, a word is split at each ':' (`builtin:d` is `builtin`, `:`, `d`),
    and an answer replaces only the piece after the last colon."""
    words = [piece for word in shlex.split(line) for piece in re.split("(:)", word) if piece]
    words += [""] if line.endswith(" ") else []
    script = (f"source {shlex.quote(str(ROOT / 'shell-completions' / 'jepa.bash'))}\n"
              f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)})\nCOMP_CWORD={len(words) - 1}\n"
              "_jepa_completion jepa\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [w for w in done.stdout.splitlines() if w]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """runs/a (a run with checkpoints 20 and 40), d.zarr (a dataset), notes/ (a plain folder)."""
    root = tmp_path_factory.mktemp("completion")
    run = root / "runs" / "a"
    for step in (20, 40):
        (run / "checkpoints" / str(step)).mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"jepa_kind": "run"}))
    (root / "d.zarr").mkdir()
    (root / "d.zarr" / "zarr.json").write_text("{}")
    (root / "notes").mkdir()
    return root


def test_a_run_argument_offers_runs_and_folders_to_descend_not_datasets(tree):
    assert bash_complete("jepa ema-inspect ", tree) == ["notes/", "runs/"]
    assert bash_complete("jepa ema-inspect runs/", tree) == ["runs/a"]


def test_a_dataset_argument_offers_datasets(tree):
    assert bash_complete("jepa encode-latents runs/a ", tree) == ["d.zarr", "notes/", "runs/"]
    assert bash_complete("jepa encode-latents runs/a d", tree) == ["d.zarr"]


def test_step_offers_the_checkpoints_of_the_run_on_the_line(tree):
    assert bash_complete("jepa ema-inspect runs/a --step ", tree) == ["20", "40"]
    assert bash_complete("jepa probe knn d.zarr d.zarr --run runs/a --step ", tree) == ["20", "40", "all"]
    assert bash_complete("jepa ema-inspect runs/none --step ", tree) == []


def test_builtin_sources_and_choices(tree):
    assert bash_complete("jepa ingest b", tree) == ["builtin:digits", "builtin:moving-digits", "builtin:tones"]
    assert bash_complete("jepa train --model h", tree) == ["huge"]
    assert bash_complete("jepa train --objective ", tree) == ["ijepa", "vjepa", "audio-jepa", "flow", "diffusion", "lejepa"]
    assert bash_complete("jepa train --data ", tree) == ["d.zarr", "notes/", "runs/"]


def test_config_offers_the_builtin_recipes(tree):
    offered = bash_complete("jepa train --config builtin:ijepa", tree)
    assert offered == ["ijepa-digits-tiny", "ijepa-in1k-vith14", "ijepa-small32", "ijepa-small32-fast"]


def test_completion_goes_on_after_the_colon_of_builtin(tree):
    assert bash_complete("jepa ingest builtin:", tree) == ["digits", "moving-digits", "tones"]
    assert bash_complete("jepa ingest builtin:mo", tree) == ["moving-digits"]
