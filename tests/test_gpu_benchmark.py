"""benchmarks/gpu.sh, the unattended GPU benchmark, run on the CPU at tiny sizes (its smoke test)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import COMPILE_FASTER

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_step import fitting_batch, peak_flops  # noqa: E402
from gpu_table import table  # noqa: E402


def test_peak_flops_reads_the_chip_table_by_device_name():
    assert peak_flops("NVIDIA H100 80GB HBM3", "bfloat16") == 989e12
    assert peak_flops("NVIDIA H200", "bfloat16") == 989e12  # the device kind JAX reported on a lent H200
    assert peak_flops("NVIDIA H100 PCIe", "bfloat16") == 756e12
    assert peak_flops("NVIDIA A100-SXM4-40GB", "float32") == 156e12
    assert peak_flops("cpu", "bfloat16") is None


def test_fitting_batch_is_the_largest_power_of_two_within_85_percent_of_memory():
    probe = {"memory": {"argument": 1_000, "temp": 16 * 100, "output": 0}}  # 100 bytes per example
    # 1000 + 100 * 64 = 7400 <= 0.85 * 8000 = 6800? no; 1000 + 100 * 32 = 4200 fits
    assert fitting_batch(probe, 16, 8_000) == 32


def test_a_failed_configuration_is_a_row_that_says_why():
    text = table([{"label": "large bf16", "error": "Traceback...\nRESOURCE_EXHAUSTED: out of memory"}])
    assert "| large bf16 | - | - | failed: RESOURCE_EXHAUSTED: out of memory |" in text


# A stand-in for torch, on the official step's process boundary (benchmarks/official_ijepa_step.py puts
# --reference first on sys.path): CUDA runs out of memory above batch 2, and batch 2 prints a row.
FAKE_TORCH = """import json, sys
batch = int(sys.argv[sys.argv.index("--batch") + 1])
if batch > 2:
    raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
print(json.dumps({"images_per_sec": 10.0 * batch, "step_ms": 100.0, "bf16": True, "model": "vit_tiny"}))
sys.exit(0)
"""


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu")
    (root / "reference" / "torch").mkdir(parents=True)
    (root / "reference" / "torch" / "__init__.py").write_text(FAKE_TORCH)
    env = {**os.environ, "TINY": "1", "STEPS": "1", "PYTHON": sys.executable, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": COMPILE_FASTER, "REFERENCE": str(root / "reference"),  # one device
           "LEVERS": "--attention-impl dot_product", "F32": "0"}  # a lever's row in place of the float32 one
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), str(root / "table.md")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return (root / "table.md").read_text(), (root / "table.md.log").read_text()


def test_gpu_script_writes_the_bf16_row_and_one_row_per_lever_on_the_cpu(tiny_run):
    text, log = tiny_run
    rows = [line for line in text.splitlines() if line.startswith("| ours")]
    assert [row.split("|")[1].strip() for row in rows] == ["ours tiny/8 32px", "ours tiny/8 32px, attention_impl dot_product"]
    assert [row.split("|")[2].strip() for row in rows] == ["bfloat16", "bfloat16"]
    assert all(row.split("|")[3].strip() == "4" for row in rows)  # the probe batch: no memory limit on a CPU
    assert all(float(row.split("|")[4]) > 0 for row in rows)
    assert log.count('"images_per_sec": ') == 3  # each row's whole output: ours twice, the official once


def test_the_official_step_halves_its_batch_on_out_of_memory(tiny_run):
    text, log = tiny_run
    assert "| official PyTorch vit_tiny | bf16 autocast | 2 | 20.0 | 100.0 |" in text  # 4 ran out of memory
    assert log.count("RuntimeError: CUDA out of memory") == 1
