"""Checks `jepa export` against the official PyTorch models: for I-JEPA, V-JEPA and Audio-JEPA, a tiny run
trained here for two steps (so the context and target encoders differ) is exported with `--all` as
.pth.tar (.ckpt for Audio-JEPA) and .safetensors, and as a one-encoder .safetensors; under PyTorch:

- `torch.load(path, weights_only=True)` and `safetensors.torch.load_file` accept the files;
- the official modules at the run's size (facebookresearch/ijepa and facebookresearch/jepa
  VisionTransformer and vit_predictor, LudovicTuncay/Audio-JEPA VisionTransformer and
  VisionTransformerPredictor) take the context encoder, predictor and target encoder with
  `load_state_dict(strict=True)`, from the checkpoint (wrapper prefixes removed, as the official
  trainers load them), from the --all safetensors (part prefixes removed) and from the
  one-encoder safetensors (as is);
- their forward on fixed inputs equals this project's: the target and context encoders on the whole
  input, the context encoder on context tokens and the predictor on target positions (V-JEPA: one
  context and one target set per mask type, mask type m with mask token m).

Prints the largest absolute difference of each output; exits 1 if any is above --atol (1e-5).

Run with a Python that has torch >= 2.0 and safetensors (never the project's venv, which this script
calls for `jepa ingest`, `jepa train`, `jepa export` and the project's forward pass):

    python scripts/check_export_in_torch.py --ijepa PATH/TO/ijepa --jepa PATH/TO/jepa \\
        --audio-jepa PATH/TO/Audio-JEPA [--project-python .venv/bin/python] [--work DIR]

The three paths are checkouts of the official repositories (their `src/` trees). Each run trains on
a few samples of a builtin dataset (digits, moving-digits, tones) for two steps; the whole check
takes about 2 minutes of CPU, mostly `jepa train`'s compilation.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SEED = 0

# name -> (builtin dataset and ingest flags, the recipe of a tiny run); the official models are built
# at the size each run.json records
FAMILIES = {
    "ijepa": (["builtin:digits", "--size", "16x16", "--channels", "3", "--limit", "16"],
              'objective = "ijepa"\nwarmup_steps = 1\n[ijepa]\nmodel = "tiny"\nwidth = 16\ndepth = 2\nheads = 2\n'
              'patch_size = 2\nimage_size = 16\npred_width = 8\npred_depth = 2\n'),
    "vjepa": (["builtin:moving-digits", "--limit", "8"],
              'objective = "vjepa"\nwarmup_steps = 1\n[vjepa]\nmodel = "tiny"\nwidth = 16\ndepth = 2\nheads = 2\n'
              'patch_size = 8\ntubelet_size = 4\nimage_size = 32\npred_width = 8\npred_depth = 2\npred_heads = 2\n'),
    "audio-jepa": (["builtin:tones", "--sample-rate", "16000", "--seconds", "1", "--limit", "8"],
                   'objective = "audio-jepa"\nwarmup_steps = 1\n["audio-jepa"]\nmodel = "tiny"\nwidth = 16\n'
                   'depth = 2\nheads = 2\npred_width = 8\npred_depth = 2\npred_heads = 2\npatch_size = 8\n'
                   'frames = 32\nmel_bins = 16\nfmax = 8000.0\n'),
}
CHECKPOINT = {"ijepa": "all.pth.tar", "vjepa": "all.pth.tar", "audio-jepa": "all.ckpt"}


# -- the project's side (run with the project's Python) ------------------------------------------------------

def ours(run: Path, inputs: Path, output: Path) -> None:
    """Writes this project's outputs on `inputs` (x channels-last, ctx, tgt) to `output`."""
    import jax

    from jepa_cli.training.run import load_run

    _config, objective, host, _step = load_run(run)
    data = np.load(inputs)

    def forward(params, ema, x, ctx, tgt):
        z_ctx = objective.encoder(params["encoder"])(x, ctx)
        z = objective.predictor(params["predictor"])(z_ctx, ctx, None, tgt, None)
        return objective.encoder(ema)(x), objective.encoder(params["encoder"])(x), z_ctx, z

    h_target, h_context, z_ctx, z = jax.jit(forward)(host["params"], host["ema"], data["x"], data["ctx"], data["tgt"])
    np.savez(output, h_target=np.asarray(h_target), h_context=np.asarray(h_context), z_ctx=np.asarray(z_ctx),
             z=np.asarray(z))


# -- the official side (run with torch) ---------------------------------------------------------------------

def _sorted_indices(rng: np.random.Generator, batch: int, n: int, k: int) -> np.ndarray:
    return np.stack([np.sort(rng.permutation(n)[:k]) for _ in range(batch)]).astype(np.int32)


def _official(name: str, repos: dict[str, Path], model: dict):
    """(encoder factory, predictor, channels-first input shape, tokens, mask types) at the run's size."""
    import torch.nn as nn

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from make_import_goldens import _forget_src, audio_jepa_modules

    heads, pred_heads = model["heads"], model.get("pred_heads") or model["heads"]
    if name == "audio-jepa":
        official = audio_jepa_modules(repos[name])
        gt, gf = model["frames"] // model["patch_size"], model["mel_bins"] // model["patch_size"]
        # configs/model/jepa.yaml: norm_layer left at nn.LayerNorm (eps 1e-5)
        encoder = functools.partial(official.VisionTransformer, input_size=(model["frames"], model["mel_bins"]),
                                    patch_size=(model["patch_size"],) * 2, in_chans=1, embed_dim=model["width"],
                                    depth=model["depth"], num_heads=heads, mlp_ratio=4.0, use_flash_attn=False)
        predictor = official.VisionTransformerPredictor(
            num_patches_h=gt, num_patches_w=gf, embed_dim=model["width"], predictor_embed_dim=model["pred_width"],
            depth=model["pred_depth"], num_heads=pred_heads, mlp_ratio=4.0, use_flash_attn=False)
        return encoder, predictor, (1, model["frames"], model["mel_bins"]), gt * gf, 1
    _forget_src()
    sys.path.insert(0, str(repos[name]))
    try:
        if name == "ijepa":
            from src.models.vision_transformer import VisionTransformer, vit_predictor
        else:
            from src.models.predictor import vit_predictor
            from src.models.utils.multimask import MultiMaskWrapper, PredictorMultiMaskWrapper
            from src.models.vision_transformer import VisionTransformer
    finally:
        sys.path.remove(str(repos[name]))
    norm = functools.partial(nn.LayerNorm, eps=1e-6)  # both vision_transformer.py's vit_* sizes
    size, patch, width = model["image_size"], model["patch_size"], model["width"]
    if name == "ijepa":  # src/helper.py init_model: the predictor has the encoder's heads
        n = (size // patch) ** 2
        encoder = functools.partial(VisionTransformer, img_size=[size], patch_size=patch,
                                    in_chans=model.get("channels", 3), embed_dim=width, depth=model["depth"],
                                    num_heads=heads, mlp_ratio=4, qkv_bias=True, norm_layer=norm)
        predictor = vit_predictor(num_patches=n, embed_dim=width, predictor_embed_dim=model["pred_width"],
                                  depth=model["pred_depth"], num_heads=heads)
        return encoder, predictor, (model.get("channels", 3), size, size), n, 1
    # app/vjepa/utils.py init_video_model: each model inside its MultiMaskWrapper
    kw = dict(img_size=size, patch_size=patch, num_frames=model["num_frames"], tubelet_size=model["tubelet_size"])
    n = (model["num_frames"] // model["tubelet_size"]) * (size // patch) ** 2

    def encoder():
        return MultiMaskWrapper(VisionTransformer(**kw, in_chans=model.get("channels", 3), embed_dim=width,
                                                  depth=model["depth"], num_heads=heads, mlp_ratio=4, qkv_bias=True,
                                                  norm_layer=norm, uniform_power=True))

    predictor = vit_predictor(**kw, embed_dim=width, predictor_embed_dim=model["pred_width"], depth=model["pred_depth"],
                              num_heads=pred_heads, uniform_power=True, use_mask_tokens=True, num_mask_tokens=2,
                              zero_init_mask_tokens=True)
    shape = (model.get("channels", 3), model["num_frames"], size, size)
    return encoder, PredictorMultiMaskWrapper(predictor), shape, n, 2


def _strip(state: dict, prefix: str) -> dict:
    assert all(k.startswith(prefix) for k in state), f"names without {prefix!r}"
    return {k[len(prefix):]: v for k, v in state.items()}


def _official_forward(name, encoder, target, predictor, x, ctx, tgt):
    """(target encoder on x, context encoder on x, context encoder on ctx, predictor) as numpy, in this
    project's shapes: z_ctx [B, K, D] ([B, mask types, K, D] for V-JEPA), z [B, M, T, D]."""
    import torch

    b, m = x.shape[0], tgt.shape[1]
    x = torch.from_numpy(x)
    tgts = [torch.from_numpy(tgt[:, i]).long() for i in range(m)]
    with torch.no_grad():
        h_target, h_context = target(x), encoder(x)
        if name == "vjepa":
            ctxs = [torch.from_numpy(ctx[:, i]).long() for i in range(m)]
            z_ctx = encoder(x, masks=ctxs)  # one [B, K, D] per mask type
            z = predictor(z_ctx, [None] * m, ctxs, tgts)  # mask type i uses mask token i (PredictorMultiMaskWrapper)
            return (h_target.numpy(), h_context.numpy(), torch.stack(z_ctx, 1).numpy(), torch.stack(z, 1).numpy())
        c = [torch.from_numpy(ctx).long()]
        z_ctx = encoder(x, c)
        z = predictor(z_ctx, c, tgts)  # [M B, T, D], row i B + b
    t = tgt.shape[2]
    return h_target.numpy(), h_context.numpy(), z_ctx.numpy(), z.reshape(m, b, t, -1).transpose(0, 1).numpy()


def _ijepa_trainer_resume(repo: Path, path: Path, encoder, predictor, target) -> int:
    """The epoch that facebookresearch/ijepa's own resume (src/helper.py load_checkpoint, modules inside
    DistributedDataParallel's `module.`) returns for the file, after checking that it loaded the same
    three models as `load_state_dict(strict=True)` did."""
    import copy

    import torch
    import torch.nn as nn

    from make_import_goldens import _forget_src

    class DDP(nn.Module):  # DistributedDataParallel's names, without a process group
        def __init__(self, module):
            super().__init__()
            self.module = module

    _forget_src()
    sys.path.insert(0, str(repo))
    try:
        from src.helper import load_checkpoint
    finally:
        sys.path.remove(str(repo))
    fresh = [DDP(copy.deepcopy(m)) for m in (encoder, predictor, target)]
    with torch.no_grad():
        for m in fresh:
            for p in m.parameters():
                p.zero_()
    opt = torch.optim.AdamW([p for m in fresh[:2] for p in m.parameters()])
    *loaded, _opt, _scaler, epoch = load_checkpoint(torch.device("cpu"), str(path), *fresh, opt, None)
    for m, ref in zip(loaded, (encoder, predictor, target)):
        for (k, v), w in zip(m.module.state_dict().items(), ref.state_dict().values()):
            assert torch.equal(v, w), f"src/helper.py load_checkpoint did not load {k}"
    return int(epoch)


def check(name: str, repos: dict[str, Path], python: Path, work: Path) -> dict[str, float]:
    """Trains, exports and compares one family; returns the largest |difference| of each output."""
    import torch
    import torch.nn as nn
    from safetensors.torch import load_file

    jepa = str(python.parent / "jepa")
    root = work / name
    root.mkdir(parents=True)
    ingest, recipe = FAMILIES[name]
    (root / "recipe.toml").write_text(recipe)
    subprocess.run([jepa, "ingest", *ingest, str(root / "data.zarr"), "--seed", str(SEED), "-q"], check=True)
    subprocess.run([jepa, "train", "--config", str(root / "recipe.toml"), "--data", str(root / "data.zarr"), "--out",
                    str(root / "run"), "--steps", "2", "--batch-size", "4", "--mesh", "data=1", "--seed", str(SEED),
                    "-q"], check=True)
    files = {"checkpoint": root / CHECKPOINT[name], "safetensors": root / "all.safetensors",
             "encoder": root / "target.safetensors"}
    for kind, path in files.items():
        subprocess.run([jepa, "export", str(root / "run"), "-o", str(path), *(["--all"] if kind != "encoder" else []),
                        "-q"], check=True)
    model = json.loads((root / "run" / "run.json").read_text())["config"]["objective_config"]
    make_encoder, predictor, shape, n, types_ = _official(name, repos, model)
    encoder, target = make_encoder(), make_encoder()

    def parts(bare: bool):  # a module of the three parts: its strict load_state_dict refuses stray names
        unwrap = (lambda m: m.backbone) if bare and name == "vjepa" else (lambda m: m)
        holder = nn.Module()
        holder.encoder, holder.predictor, holder.target_encoder = unwrap(encoder), unwrap(predictor), unwrap(target)
        return holder

    # safetensors --all: each model's own names under its part
    parts(bare=True).load_state_dict(load_file(files["safetensors"]), strict=True)
    from_safetensors = {k: v.clone() for k, v in parts(bare=False).state_dict().items()}
    checkpoint = torch.load(files["checkpoint"], weights_only=True, map_location="cpu")
    if name == "audio-jepa":  # Lightning: JEPAModule.load_state_dict(checkpoint["state_dict"])
        parts(bare=False).load_state_dict(checkpoint["state_dict"], strict=True)
    else:  # the official trainers load each part through DistributedDataParallel (module.)
        assert sorted(checkpoint) == ["encoder", "epoch", "predictor", "target_encoder"], sorted(checkpoint)
        for part, module in (("encoder", encoder), ("predictor", predictor), ("target_encoder", target)):
            module.load_state_dict(_strip(checkpoint[part], "module."), strict=True)
    for k, v in parts(bare=False).state_dict().items():  # the forward below uses the checkpoint's
        assert torch.equal(v, from_safetensors[k]), f"{name}: {k} differs between the .safetensors and the checkpoint"
    probe = make_encoder()
    (probe.backbone if name == "vjepa" else probe).load_state_dict(load_file(files["encoder"]), strict=True)
    for k, v in probe.state_dict().items():
        assert torch.equal(v, target.state_dict()[k]), f"{name}: {k} of target.safetensors is not the target's"
    for module in (encoder, predictor, target):
        module.eval()

    out = {}
    if name == "ijepa":
        out["trainer_epoch"] = _ijepa_trainer_resume(repos[name], files["checkpoint"], encoder, predictor, target)
    rng = np.random.default_rng(SEED)
    b, k, t = 2, n // 2, n // 4
    x = rng.standard_normal((b, *shape)).astype(np.float32)
    ctx = np.stack([_sorted_indices(rng, b, n, k) for _ in range(types_)], 1) if name == "vjepa" else \
        _sorted_indices(rng, b, n, k)
    tgt = np.stack([_sorted_indices(rng, b, n, t) for _ in range(2)], 1)
    theirs = _official_forward(name, encoder, target, predictor, x, ctx, tgt)
    np.savez(root / "inputs.npz", x=np.moveaxis(x, 1, -1), ctx=ctx, tgt=tgt)  # channels last, as ours takes
    subprocess.run([str(python), __file__, "ours", str(root / "run"), str(root / "inputs.npz"),
                    str(root / "ours.npz")], check=True)
    mine = np.load(root / "ours.npz")
    for key, value in zip(("h_target", "h_context", "z_ctx", "z"), theirs):
        assert mine[key].shape == value.shape, (name, key, mine[key].shape, value.shape)
        out[key] = float(np.max(np.abs(mine[key] - value)))
    out["context_vs_target"] = float(np.max(np.abs(mine["h_target"] - mine["h_context"])))
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "ours":
        ours(*(Path(a) for a in sys.argv[2:5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ijepa", type=Path, required=True, help="a checkout of facebookresearch/ijepa")
    parser.add_argument("--jepa", type=Path, required=True, help="a checkout of facebookresearch/jepa")
    parser.add_argument("--audio-jepa", type=Path, required=True, help="a checkout of LudovicTuncay/Audio-JEPA")
    parser.add_argument("--project-python", type=Path, default=ROOT / ".venv" / "bin" / "python",
                        help="the project's Python (its venv holds the jepa command)")
    parser.add_argument("--work", type=Path, default=None, help="a new folder for the runs (default: a temporary one)")
    parser.add_argument("--atol", type=float, default=1e-5)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    repos = {"ijepa": args.ijepa.resolve(), "vjepa": args.jepa.resolve(), "audio-jepa": args.audio_jepa.resolve()}
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        for name in FAMILIES:
            diffs = check(name, repos, args.project_python.absolute(), work)
            worst = max(worst, *(diffs[key] for key in ("h_target", "h_context", "z_ctx", "z")))
            print(f"{name}: max |official - ours| " + ", ".join(f"{k} {diffs[k]:.2e}" for k in
                                                                 ("h_target", "h_context", "z_ctx", "z"))
                  + f" (context and target encoders differ by up to {diffs['context_vs_target']:.2e})", flush=True)
            if "trainer_epoch" in diffs:
                print(f"{name}: src/helper.py load_checkpoint loads the three models and returns epoch "
                      f"{diffs['trainer_epoch']}", flush=True)
    print(f"largest difference {worst:.2e} ({'within' if worst <= args.atol else 'ABOVE'} {args.atol:g})")
    sys.exit(0 if worst <= args.atol else 1)


if __name__ == "__main__":
    main()
