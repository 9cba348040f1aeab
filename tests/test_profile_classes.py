"""benchmarks/op_profile.py and the official step's profile put each op in the same five classes."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import official_ijepa_step  # noqa: E402
import op_profile  # noqa: E402


def _event(name: str, micros: float, parent=None):
    return SimpleNamespace(name=name, self_cpu_time_total=micros, cpu_parent=parent)


def test_the_official_steps_aten_ops_fall_in_the_classes_of_ours_per_step():
    step = _event("forward+backward", 5.0)
    optimizer = _event("optimizer+EMA", 7.0)
    events = [step, optimizer,
              _event("aten::addmm", 400.0, step), _event("aten::mm", 200.0, step),
              _event("aten::bmm", 100.0, step), _event("aten::_softmax", 60.0, step),
              _event("aten::gather", 20.0, step), _event("aten::native_layer_norm", 80.0, step),
              _event("aten::mul_", 120.0, _event("aten::_foreach_mul_", 0.0, optimizer)),
              _event("aten::add_", 40.0, optimizer)]
    classes = official_ijepa_step.op_classes(events, steps=2)
    assert classes == pytest.approx({"matmuls": 300e-6, "attention": 80e-6, "gathers/scatters": 10e-6,
                                     "optimizer+EMA": 80e-6, "layernorm+elementwise": 40e-6})


def test_an_instruction_traced_inside_the_fused_attention_is_attention_and_a_linear_a_matmul():
    regions = op_profile._regions()
    block = str(Path("jepa_cli") / "models" / "block.py")
    fused = {"opcode": "dot", "stack": [(block, "fused_attention", 90), (block, "Attention.__call__", 130)]}
    einsum = {"opcode": "dot", "stack": [(block, "Attention.__call__", 133)]}
    linear = {"opcode": "dot", "stack": [(block, "Linear.__call__", 50), (block, "Attention.__call__", 128)]}
    assert [op_profile.classify_one(ins, regions) for ins in (fused, einsum, linear)] == ["attention", "attention",
                                                                                      "matmuls"]


def test_no_benchmark_script_shadows_a_standard_library_module():
    # each script runs with benchmarks/ first on sys.path: a profile.py there broke torch's `import cProfile`
    names = {path.stem for path in (Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py")}
    assert names & sys.stdlib_module_names == set()
