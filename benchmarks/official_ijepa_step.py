"""The official I-JEPA train step (facebookresearch/ijepa at 52c1ae95), timed on this machine.

Drives the official code itself: `src.helper.init_model` / `init_opt`, `src.masks.multiblock.
MaskCollator` (the in1k_vith14 mask options) and the body of `train_step()` in src/train.py (target
forward + layer norm, context encoder + predictor, smooth L1, backward, AdamW step with the LR / WD
schedulers, EMA update). Runs under the Python that has torch (`pip install torch==2.13.0`, the
`bench` extra); benchmarks/train_step.py --reference DIR starts it and prints both.

    python benchmarks/official_ijepa_step.py --reference ~/src/ijepa [--steps 20] [--threads 2]

Prints one JSON object: images/s (median step), step ms, and the context tokens after the cut.
The masks are in1k_vith14's except min_keep 4: on this 8x8 grid a target block of 9 or 10 patches
never exceeds min_keep 10, and the official collator then loops forever. The collator runs outside
the timed step (the official loader collates in worker processes); ours samples masks inside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reference", required=True, help="a checkout of facebookresearch/ijepa")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    sys.path.insert(0, args.reference)
    import torch
    import torch.nn.functional as F

    from src.helper import init_model, init_opt
    from src.masks.multiblock import MaskCollator
    from src.masks.utils import apply_masks
    from src.utils.tensors import repeat_interleave_batch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device("cpu")
    # the benchmark's configuration: ViT-tiny, 64x64x3, patch 8, predictor 6 x 96, float32
    encoder, predictor = init_model(device=device, patch_size=8, model_name="vit_tiny", crop_size=64,
                                    pred_depth=6, pred_emb_dim=96)
    import copy

    target_encoder = copy.deepcopy(encoder)
    for param in target_encoder.parameters():
        param.requires_grad = False
    ipe, epochs = 100, 10
    optimizer, _scaler, scheduler, wd_scheduler = init_opt(
        encoder=encoder, predictor=predictor, wd=0.04, final_wd=0.4, start_lr=2e-4, ref_lr=1e-3, final_lr=1e-6,
        iterations_per_epoch=ipe, warmup=1, num_epochs=epochs, ipe_scale=1.0, use_bfloat16=False)
    momentum_scheduler = (0.996 + i * (1.0 - 0.996) / (ipe * epochs) for i in range(ipe * epochs + 1))
    collator = MaskCollator(input_size=(64, 64), patch_size=8, pred_mask_scale=(0.15, 0.2),
                            enc_mask_scale=(0.85, 1.0), aspect_ratio=(0.75, 1.5), nenc=1, npred=4,
                            allow_overlap=False, min_keep=4)  # in1k_vith14 [mask] but min_keep 4 (see below)
    images = torch.randn(args.batch, 3, 64, 64)

    def train_step(masks_enc, masks_pred):  # src/train.py train_step(), without AMP and logging
        scheduler.step()
        wd_scheduler.step()
        with torch.no_grad():
            h = target_encoder(images)
            h = F.layer_norm(h, (h.size(-1),))
            h = apply_masks(h, masks_pred)
            h = repeat_interleave_batch(h, len(images), repeat=len(masks_enc))
        z = encoder(images, masks_enc)
        z = predictor(z, masks_enc, masks_pred)
        loss = F.smooth_l1_loss(z, h)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        with torch.no_grad():
            m = next(momentum_scheduler)
            for param_q, param_k in zip(encoder.parameters(), target_encoder.parameters()):
                param_k.data.mul_(m).add_((1. - m) * param_q.detach().data)
        return float(loss)

    times, context = [], []
    for i in range(args.steps + 3):  # 3 warm-up steps
        _, masks_enc, masks_pred = collator([(images[j],) for j in range(args.batch)])
        t = time.perf_counter()
        train_step(masks_enc, masks_pred)
        if i >= 3:
            times.append(time.perf_counter() - t)
            context.append(len(masks_enc[0][0]))
    sec = float(np.median(times))
    print(json.dumps({"images_per_sec": args.batch / sec, "step_ms": 1000 * sec, "threads": args.threads,
                      "torch": torch.__version__, "context_tokens": float(np.mean(context)),
                      "context_tokens_range": [int(min(context)), int(max(context))]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
