"""Writes tests/data/torch_layouts.pt: tensors whose storage layout a reader must follow, saved by real
`torch.save` (a transposed view, a strided slice, two views of one storage, float16, bfloat16, int64, a
0-d scalar, an nn.Parameter). tests/test_import_checkpoint.py reads it without torch and compares with
the same values built in numpy.

    python tests/data/make_torch_layouts.py   # with torch installed (pip install torch==2.13.0)
"""

from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def main() -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    torch.save({"t": base.t(), "slice": base[1:3, 2:5], "same": base, "half": base.half(), "long": torch.arange(3),
                "scalar": torch.tensor(2.5), "param": torch.nn.Parameter(torch.ones(2)), "bf16": base.bfloat16()},
               HERE / "torch_layouts.pt")


if __name__ == "__main__":
    main()
