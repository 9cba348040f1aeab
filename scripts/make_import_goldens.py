"""Writes the V-JEPA and Audio-JEPA import goldens: tiny official models with random weights, saved in
each codebase's checkpoint layout, and the official forward outputs on fixed inputs.

Needs PyTorch (the `bench` extra, or any torch >= 2.0) and checkouts of the two official repositories
(their `src/` trees), never the project's venv:

    python scripts/make_import_goldens.py --jepa PATH/TO/facebookresearch-jepa --audio-jepa PATH/TO/Audio-JEPA

Writes, under tests/data/:
- official_vjepa_tiny.pth.tar: app/vjepa/train.py save_checkpoint()'s dict (encoder, predictor,
  target_encoder with the `module.backbone.` names of DDP around MultiMaskWrapper, opt, scaler, epoch
  2, ...) for src/models/vision_transformer.py's VisionTransformer (16 px, patch 4, 4 frames in
  tubelets of 2, width 16, depth 2, 2 heads, LayerNorm eps 1e-6, uniform_power) and predictor.py's
  vit_predictor (width 8, depth 2, 2 heads, 2 zero-initialised mask tokens), built as
  app/vjepa/utils.py init_video_model builds them;
- official_audio_jepa_tiny.ckpt: a PyTorch Lightning checkpoint of JEPAModule (state_dict of
  encoder., target_encoder., predictor.; epoch 3, global_step 120; hyper_parameters holding
  functools.partial optimisers and the MAWeightUpdate callback, as save_hyperparameters stores
  them; a small optimizer state) for src/models/components/vision_transformer.py's
  VisionTransformer (a 32-frame x 16-mel spectrogram, patch 8, width 16, depth 2, 2 heads, torch's
  LayerNorm eps 1e-5 as the Hydra config leaves it) and VisionTransformerPredictor (width 8, depth
  2, 2 heads);
- golden/vjepa_forward.npz and golden/audio_jepa_forward.npz: the inputs and the official outputs.

Every parameter is perturbed by 0.05 N(0, 1) after construction (mask tokens and LayerNorm affines
are then not trivial), and the target encoder is the encoder perturbed again (so the two differ).
flash_attn (CUDA only) is replaced by its MHA's non-flash path: Wqkv, the (three, heads, head_dim)
split, SelfAttention (softmax of q k^T / sqrt(head_dim)), out_proj, under the same parameter names.
"""

from __future__ import annotations

import argparse
import collections
import functools
import math
import sys
import types
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def _package(name: str, path: Path | None = None) -> types.ModuleType:
    """An empty package `name` in sys.modules (its __init__ not run: Audio-JEPA's src/utils imports
    Hydra and Lightning, which the models do not need)."""
    module = types.ModuleType(name)
    module.__path__ = [str(path)] if path else []
    sys.modules[name] = module
    return module


def _forget_src() -> None:
    for name in [n for n in sys.modules if n == "src" or n.startswith("src.")]:
        del sys.modules[name]


def _perturb(module: nn.Module, generator: torch.Generator) -> None:
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=generator))


def _sorted_indices(generator: torch.Generator, batch: int, n: int, k: int) -> torch.Tensor:
    return torch.stack([torch.randperm(n, generator=generator)[:k].sort().values for _ in range(batch)])


def _tiny_opt_state() -> dict:
    """An AdamW state_dict after one step on a small tensor: tensors the importer must not need."""
    w = nn.Parameter(torch.ones(3, 2))
    opt = torch.optim.AdamW([w], lr=1e-3)
    w.grad = torch.full((3, 2), 0.5)
    opt.step()
    return opt.state_dict()


def vjepa(repo: Path) -> None:
    _forget_src()
    sys.path.insert(0, str(repo))
    try:
        from src.models.predictor import vit_predictor
        from src.models.utils.multimask import MultiMaskWrapper, PredictorMultiMaskWrapper
        from src.models.vision_transformer import VisionTransformer
    finally:
        sys.path.remove(str(repo))
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    kw = dict(img_size=16, patch_size=4, num_frames=4, tubelet_size=2)
    encoder = VisionTransformer(**kw, in_chans=3, embed_dim=16, depth=2, num_heads=2, mlp_ratio=4, qkv_bias=True,
                                norm_layer=functools.partial(nn.LayerNorm, eps=1e-6), uniform_power=True)
    predictor = vit_predictor(**kw, embed_dim=16, predictor_embed_dim=8, depth=2, num_heads=2, uniform_power=True,
                              use_mask_tokens=True, num_mask_tokens=2, zero_init_mask_tokens=True)
    _perturb(encoder, g)
    _perturb(predictor, g)
    target = VisionTransformer(**kw, in_chans=3, embed_dim=16, depth=2, num_heads=2, mlp_ratio=4, qkv_bias=True,
                               norm_layer=functools.partial(nn.LayerNorm, eps=1e-6), uniform_power=True)
    target.load_state_dict(encoder.state_dict())
    _perturb(target, g)
    encoder, predictor, target = MultiMaskWrapper(encoder), PredictorMultiMaskWrapper(predictor), MultiMaskWrapper(target)
    for m in (encoder, predictor, target):
        m.eval()

    b, n, k, t = 2, 32, 10, 6  # a 2 x 4 x 4 token grid
    clips = torch.randn(b, 3, 4, 16, 16, generator=g)  # [B, C, T, H, W]
    ctx = [_sorted_indices(g, b, n, k) for _ in range(2)]
    tgt = [_sorted_indices(g, b, n, t) for _ in range(2)]
    with torch.no_grad():
        h_full = target(clips)
        z_ctx = encoder(clips, masks=ctx)  # one [B, K, D] per mask type
        z = predictor(z_ctx, [None, None], ctx, tgt)  # mask type m uses mask token m
    np.savez(DATA / "golden" / "vjepa_forward.npz", clips=clips.numpy(), ctx=torch.stack(ctx, 1).numpy(),
             tgt=torch.stack(tgt, 1).numpy(), h_full=h_full.numpy(), z_ctx=torch.stack(z_ctx, 1).numpy(),
             z=torch.stack(z, 1).numpy())

    def ddp(module):  # DistributedDataParallel's names
        return collections.OrderedDict((f"module.{k}", v) for k, v in module.state_dict().items())

    torch.save({  # app/vjepa/train.py save_checkpoint()
        "encoder": ddp(encoder), "predictor": ddp(predictor), "opt": _tiny_opt_state(), "scaler": None,
        "target_encoder": ddp(target), "epoch": 2, "loss": 0.4711, "batch_size": 24, "world_size": 128,
        "lr": 6.25e-4}, DATA / "official_vjepa_tiny.pth.tar")


class _MHA(nn.Module):
    """flash_attn.modules.mha.MHA's self-attention without the flash kernel (its SelfAttention path)."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, qkv_proj_bias=True, out_proj_bias=True, **_):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.Wqkv = nn.Linear(embed_dim, 3 * embed_dim, bias=qkv_proj_bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=out_proj_bias)

    def forward(self, x):
        qkv = self.Wqkv(x).unflatten(-1, (3, self.num_heads, self.head_dim))  # "... (three h d) -> ... three h d"
        q, k, v = qkv.unbind(dim=2)
        scores = torch.einsum("bthd,bshd->bhts", q, k * (1.0 / math.sqrt(self.head_dim)))
        attention = torch.softmax(scores, dim=-1, dtype=v.dtype)
        context = torch.einsum("bhts,bshd->bthd", attention, v)
        return self.out_proj(context.flatten(-2))


def audio_jepa_modules(repo: Path) -> types.SimpleNamespace:
    """Audio-JEPA's model, callback and scheduler classes from a checkout, with flash_attn and Lightning
    stood in for (neither is needed to build or run the models on CPU)."""
    _forget_src()
    _package("flash_attn")
    _package("flash_attn.modules")
    sys.modules["flash_attn.modules.mha"] = types.SimpleNamespace(MHA=_MHA)
    _package("lightning")
    sys.modules["lightning.pytorch"] = types.SimpleNamespace(Callback=object, LightningModule=object, Trainer=object)
    _package("src", repo / "src")
    _package("src.utils", repo / "src" / "utils")
    sys.path.insert(0, str(repo))
    try:
        from src.callbacks.MA_weight_update_callback import MAWeightUpdate
        from src.models.components.vision_transformer import VisionTransformer, VisionTransformerPredictor
        from src.optimizers.cosine_wd import CosineWDScheduler
        from src.optimizers.warmup_cosine import WarmupCosineScheduler
    finally:
        sys.path.remove(str(repo))
    return types.SimpleNamespace(MAWeightUpdate=MAWeightUpdate, VisionTransformer=VisionTransformer,
                                 VisionTransformerPredictor=VisionTransformerPredictor,
                                 CosineWDScheduler=CosineWDScheduler, WarmupCosineScheduler=WarmupCosineScheduler)


def audio_jepa(repo: Path) -> None:
    official = audio_jepa_modules(repo)
    VisionTransformer, VisionTransformerPredictor = official.VisionTransformer, official.VisionTransformerPredictor
    MAWeightUpdate, CosineWDScheduler = official.MAWeightUpdate, official.CosineWDScheduler
    WarmupCosineScheduler = official.WarmupCosineScheduler
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    # as configs/model/jepa.yaml instantiates them (norm_layer left at nn.LayerNorm), tiny
    enc_kw = dict(input_size=(32, 16), patch_size=(8, 8), in_chans=1, embed_dim=16, depth=2, num_heads=2,
                  mlp_ratio=4.0, use_flash_attn=False)
    encoder = VisionTransformer(**enc_kw)
    predictor = VisionTransformerPredictor(num_patches_h=4, num_patches_w=2, embed_dim=16, predictor_embed_dim=8,
                                           depth=2, num_heads=2, mlp_ratio=4.0, num_sources=4, use_flash_attn=False)
    _perturb(encoder, g)
    _perturb(predictor, g)
    target = VisionTransformer(**enc_kw)
    target.load_state_dict(encoder.state_dict())
    _perturb(target, g)
    for m in (encoder, predictor, target):
        m.eval()

    b, n, k, t = 3, 8, 5, 3  # a 4 (time) x 2 (mel) token grid
    spec = torch.randn(b, 1, 32, 16, generator=g)  # [B, 1, frames, mel]
    ctx = _sorted_indices(g, b, n, k)
    tgt = [_sorted_indices(g, b, n, t) for _ in range(2)]
    with torch.no_grad():
        h_full = target(spec)
        z_ctx = encoder(spec, [ctx])
        z = predictor(z_ctx, [ctx], tgt)  # [M B, T, D], row m B + b
    np.savez(DATA / "golden" / "audio_jepa_forward.npz", spec=spec.numpy(), ctx=ctx.numpy(),
             tgt=torch.stack(tgt, 1).numpy(), h_full=h_full.numpy(), z_ctx=z_ctx.numpy(),
             z=z.reshape(2, b, t, -1).transpose(0, 1).numpy())

    state = collections.OrderedDict()
    for prefix, module in (("encoder", encoder), ("target_encoder", target), ("predictor", predictor)):
        state.update((f"{prefix}.{k}", v) for k, v in module.state_dict().items())
    torch.save({  # lightning/pytorch/trainer/connectors/checkpoint_connector.py dump_checkpoint()
        "epoch": 3, "global_step": 120, "pytorch-lightning_version": "2.5.0.post0", "state_dict": state,
        "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 4, "completed": 3}}}},
        "callbacks": {"ModelCheckpoint{'monitor': None}": {"best_model_score": None, "best_model_path": ""}},
        "optimizer_states": [_tiny_opt_state()], "lr_schedulers": [{"last_epoch": 120, "warmup_steps": 1000}],
        "hparams_name": "kwargs",
        "hyper_parameters": {  # JEPAModule.save_hyperparameters(ignore=[encoder, predictor, criterion])
            "optimizer": functools.partial(torch.optim.AdamW, lr=0.0003, weight_decay=0.05, betas=[0.9, 0.95]),
            "lr_scheduler": functools.partial(WarmupCosineScheduler, warmup_steps=1000, start_lr=1e-6, ref_lr=1e-3,
                                              final_lr=0.0),
            "wd_scheduler": functools.partial(CosineWDScheduler, ref_wd=1e-6, final_wd=1e-6),
            "ma_callback": MAWeightUpdate(), "compile": False}}, DATA / "official_audio_jepa_tiny.ckpt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jepa", type=Path, required=True, help="a checkout of facebookresearch/jepa")
    parser.add_argument("--audio-jepa", type=Path, required=True, help="a checkout of LudovicTuncay/Audio-JEPA")
    args = parser.parse_args()
    torch.set_num_threads(1)
    vjepa(args.jepa.resolve())
    audio_jepa(args.audio_jepa.resolve())


if __name__ == "__main__":
    main()
