"""benchmarks/gpu.sh, the unattended GPU benchmark, run on the CPU at tiny sizes (its smoke test)."""

import os
import subprocess
import sys
from pathlib import Path

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


def test_gpu_script_writes_one_row_per_dtype_on_the_cpu(tmp_path):
    out = tmp_path / "table.md"
    env = {**os.environ, "TINY": "1", "STEPS": "1", "PYTHON": sys.executable, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}  # one device
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), str(out)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ours")]
    assert [row.split("|")[2].strip() for row in rows] == ["bfloat16", "float32"]
    assert all(row.split("|")[3].strip() == "4" for row in rows)  # the probe batch: no memory limit on a CPU
    assert all(float(row.split("|")[4]) > 0 for row in rows)
    assert (tmp_path / "table.md.log").read_text().count('"images_per_sec"') == 2  # each row's whole output
