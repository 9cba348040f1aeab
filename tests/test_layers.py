"""The package's layers (.importlinter): cli, then sampling and evaluation, then training, objectives,
masks and models, data, errors; a module imports only from its own layer's package or those below,
and no two modules of one package import each other (directly or through others), at the top of a
file or inside a function alike."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def test_no_module_imports_from_a_layer_above_its_own_nor_in_a_cycle():
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache", str(ROOT / ".importlinter")], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "2 kept, 0 broken" in result.stdout  # the layers and the acyclic contracts
