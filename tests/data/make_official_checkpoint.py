"""Writes tests/data/official_ijepa_tiny.pth.tar: the golden official weights (tests/data/golden/
ijepa_forward_backward.npz: a ViT with 32 px images, patch 4, width 64, depth 2, 4 heads; a predictor
of width 32, depth 2) saved by real `torch.save` in the layout of facebookresearch/ijepa's
src/train.py save_checkpoint(): encoder / predictor / target_encoder state dicts with the
`module.` prefix of DistributedDataParallel, plus opt, scaler, epoch, loss, batch_size,
world_size, lr. tests/test_import_checkpoint.py reads it (no torch needed there).

    python tests/data/make_official_checkpoint.py   # with torch installed (pip install torch==2.13.0)
"""

from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
EPOCH = 3


def state_dict(golden, group: str) -> dict:
    return {f"module.{k[len(group) + 1:]}": torch.from_numpy(np.ascontiguousarray(golden[k]))
            for k in golden.files if k.startswith(group + "/")}


def main() -> None:
    golden = np.load(HERE / "golden" / "ijepa_forward_backward.npz")
    checkpoint = {  # src/train.py save_checkpoint()
        "encoder": state_dict(golden, "enc"),
        "predictor": state_dict(golden, "pred"),
        "target_encoder": state_dict(golden, "tgt"),
        "opt": {"state": {}, "param_groups": [{"lr": 1e-3, "weight_decay": 0.04, "params": [0, 1]}]},
        "scaler": None,
        "epoch": EPOCH,
        "loss": 0.4711,
        "batch_size": 128,
        "world_size": 16,
        "lr": 1e-3,
    }
    torch.save(checkpoint, HERE / "official_ijepa_tiny.pth.tar")


if __name__ == "__main__":
    main()
