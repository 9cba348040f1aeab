"""The official I-JEPA train step (facebookresearch/ijepa at 52c1ae95), timed on this machine.

Drives the official code itself: `src.helper.init_model` / `init_opt`, `src.masks.multiblock.
MaskCollator` (the in1k_vith14 mask options) and the body of `train_step()` in src/train.py (target
forward + layer norm, context encoder + predictor, smooth L1, backward, AdamW step with the LR / WD
schedulers, EMA update). Runs under the Python that has torch (`pip install torch==2.13.0`, the
`bench` extra); benchmarks/train_step.py --reference DIR starts it and prints both.

    python benchmarks/official_ijepa_step.py --reference ~/src/ijepa [--steps 20] [--threads 2]

Prints one JSON object: images/s (median step), step ms, and the context tokens after the cut.
`--profile` adds the step's time per op class from torch's profiler (`op_classes`: the classes of
benchmarks/op_profile.py, so that the two tables compare row by row).
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
    p.add_argument("--model", default="vit_tiny", help="the official model name (vit_tiny ... vit_huge)")
    p.add_argument("--crop-size", type=int, default=64)
    p.add_argument("--patch-size", type=int, default=8)
    p.add_argument("--pred-depth", type=int, default=6)
    p.add_argument("--pred-emb-dim", type=int, default=96)
    p.add_argument("--min-keep", type=int, default=4)
    p.add_argument("--device", default="cpu", help="cpu | cuda")
    p.add_argument("--bf16", action="store_true", help="autocast to bfloat16 as src/train.py (use_bfloat16)")
    p.add_argument("--profile", action="store_true", help="also the time per op class (torch.profiler, CPU)")
    args = p.parse_args(argv)
    sys.path.insert(0, args.reference)
    import torch
    import torch.nn.functional as F
    from torch.profiler import record_function

    from src.helper import init_model, init_opt
    from src.masks.multiblock import MaskCollator
    from src.masks.utils import apply_masks
    from src.utils.tensors import repeat_interleave_batch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    # default: the CPU benchmark's configuration (ViT-tiny, 64x64x3, patch 8, predictor 6 x 96, float32)
    encoder, predictor = init_model(device=device, patch_size=args.patch_size, model_name=args.model,
                                    crop_size=args.crop_size, pred_depth=args.pred_depth,
                                    pred_emb_dim=args.pred_emb_dim)
    import copy

    target_encoder = copy.deepcopy(encoder)
    for param in target_encoder.parameters():
        param.requires_grad = False
    ipe, epochs = 100, 10
    optimizer, _scaler, scheduler, wd_scheduler = init_opt(
        encoder=encoder, predictor=predictor, wd=0.04, final_wd=0.4, start_lr=2e-4, ref_lr=1e-3, final_lr=1e-6,
        iterations_per_epoch=ipe, warmup=1, num_epochs=epochs, ipe_scale=1.0, use_bfloat16=args.bf16)
    momentum_scheduler = (0.996 + i * (1.0 - 0.996) / (ipe * epochs) for i in range(ipe * epochs + 1))
    collator = MaskCollator(input_size=(args.crop_size, args.crop_size), patch_size=args.patch_size,
                            pred_mask_scale=(0.15, 0.2), enc_mask_scale=(0.85, 1.0), aspect_ratio=(0.75, 1.5),
                            nenc=1, npred=4, allow_overlap=False, min_keep=args.min_keep)  # in1k_vith14 [mask]
    images = torch.randn(args.batch, 3, args.crop_size, args.crop_size, device=device)
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=args.bf16)

    def train_step(masks_enc, masks_pred):  # src/train.py train_step(), without logging
        masks_enc = [m.to(device, non_blocking=True) for m in masks_enc]
        masks_pred = [m.to(device, non_blocking=True) for m in masks_pred]
        scheduler.step()
        wd_scheduler.step()
        with autocast, record_function("forward+backward"):
            with torch.no_grad():
                h = target_encoder(images)
                h = F.layer_norm(h, (h.size(-1),))
                h = apply_masks(h, masks_pred)
                h = repeat_interleave_batch(h, len(images), repeat=len(masks_enc))
            z = encoder(images, masks_enc)
            z = predictor(z, masks_enc, masks_pred)
            loss = F.smooth_l1_loss(z, h)
            if args.bf16:  # src/train.py: scaler.scale(loss).backward(); scaler.step(optimizer)
                _scaler.scale(loss).backward()
            else:
                loss.backward()
        with record_function("optimizer+EMA"):
            if args.bf16:
                _scaler.step(optimizer)
                _scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad()
        with torch.no_grad(), record_function("optimizer+EMA"):
            m = next(momentum_scheduler)
            for param_q, param_k in zip(encoder.parameters(), target_encoder.parameters()):
                param_k.data.mul_(m).add_((1. - m) * param_q.detach().data)
        return float(loss)

    times, context = [], []
    cpu_images = images.cpu()  # the collator stacks the batch on the host, as in the official loader
    for i in range(args.steps + 3):  # 3 warm-up steps
        _, masks_enc, masks_pred = collator([(cpu_images[j],) for j in range(args.batch)])
        t = time.perf_counter()
        train_step(masks_enc, masks_pred)
        if i >= 3:
            times.append(time.perf_counter() - t)
            context.append(len(masks_enc[0][0]))
    sec = float(np.median(times))
    classes = None
    if args.profile:
        steps = 3
        masks = [collator([(cpu_images[j],) for j in range(args.batch)])[1:] for _ in range(steps)]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for masks_enc, masks_pred in masks:
                train_step(masks_enc, masks_pred)
        classes = op_classes(prof.events(), steps)
    print(json.dumps({"images_per_sec": args.batch / sec, "step_ms": 1000 * sec, "threads": args.threads,
                      "device": args.device, "bf16": args.bf16, "model": args.model,
                      "torch": torch.__version__, "context_tokens": float(np.mean(context)),
                      "context_tokens_range": [int(min(context)), int(max(context))], "op_classes": classes}))
    return 0


# aten ops by benchmarks/op_profile.py's classes: the official Attention computes q @ k^T and attn @ v as
# batched matmuls (bmm) and its softmax explicitly; the Linear layers are addmm / mm
ATTENTION_OPS = {"aten::bmm", "aten::_softmax", "aten::_softmax_backward_data", "aten::baddbmm"}
MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::_convolution", "aten::mkldnn_convolution",
              "aten::convolution_backward", "aten::linear_backward"}
GATHER_OPS = {"aten::gather", "aten::scatter", "aten::scatter_add_", "aten::index_select", "aten::index",
              "aten::index_add_", "aten::index_put_", "aten::_index_put_impl_", "aten::gather_backward",
              "aten::sort", "aten::masked_select"}


def op_classes(events, steps: int) -> dict[str, float]:
    """Seconds per step in each op class: every event's self CPU time, put in optimizer+EMA when a
    `record_function("optimizer+EMA")` range encloses it, else by its aten name."""
    out = dict.fromkeys(("matmuls", "attention", "gathers/scatters", "optimizer+EMA", "layernorm+elementwise"), 0.0)

    def enclosing(event) -> bool:
        parent = event.cpu_parent
        while parent is not None:
            if parent.name == "optimizer+EMA":
                return True
            parent = parent.cpu_parent
        return False

    for event in events:
        if event.name in ("forward+backward", "optimizer+EMA") or event.name.startswith("ProfilerStep"):
            continue
        seconds = event.self_cpu_time_total * 1e-6 / steps
        if enclosing(event):
            out["optimizer+EMA"] += seconds
        elif event.name in ATTENTION_OPS:
            out["attention"] += seconds
        elif event.name in MATMUL_OPS:
            out["matmuls"] += seconds
        elif event.name in GATHER_OPS:
            out["gathers/scatters"] += seconds
        else:
            out["layernorm+elementwise"] += seconds
    return out


if __name__ == "__main__":
    sys.exit(main())
