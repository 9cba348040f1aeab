"""The ViT encoder + predictor configurations (ModelConfig, VideoModelConfig) and the size table.

Each field is an option declared once (jepa_cli/options.py): the TOML key, run.json's entry and, for
the flagged ones, the `jepa train` option come from it. This module imports no JAX (the modules are
built in models/vit.py), so the CLI can read it before JAX loads.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, NamedTuple

from jepa_cli.errors import InputError
from jepa_cli.fieldtypes import check_field_types
from jepa_cli.models.mixer_pattern import (ATTENTION_IMPLS, JEPA_MIXER_APPLIES, MIXER_APPLIES, SCAN_ORDERS, SSM_GAPS,
                                          SSM_STEP, check_ssm, parse_mixer)
from jepa_cli.names import COMPUTE_DTYPES, MODEL_NAMES, REMAT_POLICIES
from jepa_cli.options import option

if TYPE_CHECKING:
    from jepa_cli.models.vit import VisionTransformer, VisionTransformerPredictor


class ModelSize(NamedTuple):
    width: int
    depth: int
    heads: int
    mlp_ratio: float = 4.0


MODEL_SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(192, 12, 3),
    "small": ModelSize(384, 12, 6),
    "base": ModelSize(768, 12, 12),
    "large": ModelSize(1024, 24, 16),
    "huge": ModelSize(1280, 32, 16),
    "giant": ModelSize(1408, 40, 16, 48 / 11),
}

assert tuple(MODEL_SIZES) == MODEL_NAMES


def as_pair(x) -> tuple[int, int]:
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise InputError(f"expected one size or (height, width), got {x!r}")
        return int(x[0]), int(x[1])
    return int(x), int(x)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Encoder + predictor configuration.

    ``width``/``depth``/``heads``/``mlp_ratio`` override the ``model`` size table entry (None: the
    table's value), for custom or test-sized models. ``pred_heads`` None means the encoder's heads.
    ``dtype`` is the compute dtype ('float32' | 'bfloat16'); parameters are always float32.
    """

    model: str = option("tiny", "Encoder size (width, depth, heads from the size table).", flag=True,
                        choices=MODEL_NAMES)
    patch_size: int = option(16, "Patch size in pixels.", flag=True)
    image_size: int | tuple[int, int] = option(224, "Training crop size, S or HxW (default in jepa train: the dataset's).",
                                               flag=True)
    channels: int = option(3, "Image channels (default in jepa train: the dataset's).")
    pred_depth: int = option(6, "Predictor depth (blocks).", flag=True)
    pred_width: int = option(384, "Predictor width.", flag=True)
    pred_heads: int | None = option(None, "Predictor attention heads (default: the encoder's).")
    dtype: str = option("float32", "Compute dtype of matmuls and attention; parameters stay float32.", flag=True,
                        choices=COMPUTE_DTYPES)
    width: int | None = option(None, "Encoder width (default: the size table's).")
    depth: int | None = option(None, "Encoder depth (default: the size table's).")
    heads: int | None = option(None, "Encoder attention heads (default: the size table's).")
    mlp_ratio: float | None = option(None, "MLP hidden width / width (default: the size table's).")
    # how the blocks run (no effect on the parameters or, beyond float rounding, on the outputs)
    scan_layers: bool = option(False, "Run the blocks under lax.scan: compile time no longer grows with depth.",
                               flag=True)
    remat: str = option("none", "Activation checkpointing per block: keep matmul outputs (dots) or only block "
                        "inputs (block).", flag=True, choices=REMAT_POLICIES)
    attention_impl: str = option("xla", "Attention kernel: xla (einsums and a float32 softmax, the official maths) or "
                                 "dot_product (jax.nn.dot_product_attention: cuDNN flash attention on an NVIDIA GPU in bfloat16, "
                                 "XLA's elsewhere).",
                                 flag=True, choices=ATTENTION_IMPLS)
    # token mixers (models/mixer_pattern.py, models/s5.py); 'attn' is the ViT, unchanged
    # (one declaration for every objective: GenerativeConfig takes these three for the DiT, under the same flags)
    mixer: str = option("attn", "Token mixer per block: attn, s5 or a comma-separated PATTERN repeated over the "
                        "depth of each stack, encoder, predictor or DiT (s5,s5,s5,attn: 3:1 at a depth of 4, 8, 12...).", flag=True,
                        applies=MIXER_APPLIES, metavar="PATTERN")
    pred_mixer: str = option("", "Token mixer PATTERN of the predictor alone (as --mixer); empty: the --mixer "
                             "pattern. A 2-block predictor under a 3:1 encoder: attn.", flag=True,
                             applies=JEPA_MIXER_APPLIES, metavar="PATTERN")
    ssm_state: int = option(64, "S5 state size P (even; P/2 conjugate-pair states are stored).", flag=True,
                            applies=MIXER_APPLIES)
    ssm_step: tuple[float, float] = option(SSM_STEP, "S5 initial step range LO,HI: each state's learned step "
                                           "starts log-uniform in it; the state forgets over about 2 / step "
                                           "tokens.", flag=True, applies=MIXER_APPLIES, metavar="LO,HI")
    scan_order: str = option("raster", "Order in which S5 blocks scan the patch grid (per frame for video).",
                             flag=True, choices=SCAN_ORDERS, applies=MIXER_APPLIES)
    ssm_gaps: str = option("skip", "What a masked hole in the scan is to an S5 block: skip (the kept tokens are "
                           "consecutive steps) or elapse (the state decays over one step per hidden token, as "
                           "if the hole were zeros).", flag=True, choices=SSM_GAPS, applies=JEPA_MIXER_APPLIES)
    # I-JEPA and V-JEPA vit_*: partial(nn.LayerNorm, eps=1e-6)
    norm_eps: float = option(1e-6, "LayerNorm epsilon of the encoder and predictor.")

    def __post_init__(self):
        check_field_types(self, "model")
        if self.remat not in REMAT_POLICIES:
            raise InputError(f"unknown remat {self.remat!r} (choose from {', '.join(REMAT_POLICIES)})")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise InputError(f"unknown attention_impl {self.attention_impl!r} (choose from {', '.join(ATTENTION_IMPLS)})")
        if self.model not in MODEL_SIZES:
            raise InputError(
                f"unknown model size {self.model!r} (choose from {', '.join(MODEL_SIZES)})"
            )
        if self.dtype not in COMPUTE_DTYPES:
            raise InputError(f"unknown dtype {self.dtype!r} (choose from {', '.join(COMPUTE_DTYPES)})")
        if isinstance(self.image_size, list):
            object.__setattr__(self, "image_size", tuple(self.image_size))
        h, w = as_pair(self.image_size)
        if h <= 0 or w <= 0:
            raise InputError(f"image size {h}x{w} must be positive")
        for name in ("width", "depth", "heads", "pred_heads", "mlp_ratio"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise InputError(f"{name} must be positive, got {getattr(self, name)}")
        if self.pred_width <= 0:
            raise InputError(f"pred_width must be positive, got {self.pred_width}")
        p = self.patch_size
        if p <= 0 or h % p or w % p:
            raise InputError(f"image size {h}x{w} is not divisible by the patch size {p}")
        if self.embed_dim % self.num_heads:
            raise InputError(f"width {self.embed_dim} is not divisible by {self.num_heads} heads")
        if self.embed_dim % 4:
            raise InputError(f"width {self.embed_dim} must be divisible by 4 (2D sin-cos)")
        if self.pred_width % self.predictor_heads or self.pred_width % 4:
            raise InputError(
                f"predictor width {self.pred_width} must be divisible by 4 and by "
                f"{self.predictor_heads} heads"
            )
        if self.channels <= 0 or self.pred_depth < 0 or self.encoder_depth <= 0:
            raise InputError("channels and depth must be positive")
        _ = self.encoder_mixers, self.predictor_mixers  # parses the pattern: a bad one is an InputError
        if not self.norm_eps > 0:
            raise InputError(f"norm_eps must be > 0, got {self.norm_eps!r}")
        object.__setattr__(self, "ssm_step", tuple(self.ssm_step))
        check_ssm(self.ssm_state, self.ssm_step)
        if self.scan_order not in SCAN_ORDERS:
            raise InputError(f"unknown scan_order {self.scan_order!r} (choose from {', '.join(SCAN_ORDERS)})")
        if self.ssm_gaps not in SSM_GAPS:
            raise InputError(f"unknown ssm_gaps {self.ssm_gaps!r} (choose from {', '.join(SSM_GAPS)})")

    @property
    def size(self) -> ModelSize:
        return MODEL_SIZES[self.model]

    @property
    def embed_dim(self) -> int:
        return self.width or self.size.width

    @property
    def encoder_depth(self) -> int:
        return self.depth or self.size.depth

    @property
    def num_heads(self) -> int:
        return self.heads or self.size.heads

    @property
    def encoder_mlp_ratio(self) -> float:
        return self.mlp_ratio or self.size.mlp_ratio

    @property
    def predictor_heads(self) -> int:
        return self.pred_heads or self.num_heads

    @property
    def encoder_mixers(self) -> tuple[str, ...]:
        """The mixer of each encoder block ('attn' or 's5')."""
        return parse_mixer(self.mixer, self.encoder_depth, "encoder")

    @property
    def predictor_mixers(self) -> tuple[str, ...]:
        """The mixer of each predictor block: `pred_mixer`, else `mixer`, repeated to the predictor's depth."""
        return parse_mixer(self.pred_mixer or self.mixer, self.pred_depth, "predictor") if self.pred_depth else ()

    def _mixer_kwargs(self, mixers: tuple[str, ...]) -> dict:
        """The mixer and norm arguments of a stack: none for attention only, so those modules stay as they were."""
        norm = {"norm_eps": self.norm_eps}
        if set(mixers) <= {"attn"}:
            return norm
        return {"mixers": mixers, "ssm_state": self.ssm_state, "ssm_step": self.ssm_step, "scan_order": self.scan_order,
                "ssm_gaps": self.ssm_gaps, **norm}

    @property
    def grid(self) -> tuple[int, int]:
        h, w = as_pair(self.image_size)
        return h // self.patch_size, w // self.patch_size

    @property
    def num_patches(self) -> int:
        gh, gw = self.grid
        return gh * gw

    @property
    def compute_dtype(self):
        from jepa_cli.models.vit import DTYPES

        return DTYPES[self.dtype]

    def encoder(self, rngs) -> "VisionTransformer":
        from jepa_cli.models.block import use_attention
        from jepa_cli.models.vit import VisionTransformer

        return use_attention(VisionTransformer(
            image_size=as_pair(self.image_size),
            patch_size=self.patch_size,
            channels=self.channels,
            width=self.embed_dim,
            depth=self.encoder_depth,
            heads=self.num_heads,
            mlp_ratio=self.encoder_mlp_ratio,
            dtype=self.compute_dtype,
            rngs=rngs,
            scan_layers=self.scan_layers,
            remat=self.remat,
            **self._mixer_kwargs(self.encoder_mixers),
        ), self.attention_impl)

    def predictor(self, rngs) -> "VisionTransformerPredictor":
        from jepa_cli.models.block import use_attention
        from jepa_cli.models.vit import VisionTransformerPredictor

        return use_attention(VisionTransformerPredictor(
            grid=self.grid,
            embed_dim=self.embed_dim,
            width=self.pred_width,
            depth=self.pred_depth,
            heads=self.predictor_heads,
            mlp_ratio=4.0,
            dtype=self.compute_dtype,
            rngs=rngs,
            scan_layers=self.scan_layers,
            remat=self.remat,
            **self._mixer_kwargs(self.predictor_mixers),
        ), self.attention_impl)


@dataclasses.dataclass(frozen=True)
class VideoModelConfig(ModelConfig):
    """A video ViT (V-JEPA): clips of ``num_frames`` frames cut into tubelets of ``tubelet_size``
    frames x patch x patch; a (frames / tubelet, H / patch, W / patch) token grid, frame-major."""

    num_frames: int = option(16, "Frames per clip.")  # V-JEPA configs/pretrain/vitl16.yaml: data.num_frames
    tubelet_size: int = option(2, "Frames per tubelet (token depth).")  # vitl16.yaml: data.tubelet_size

    def __post_init__(self):
        super().__post_init__()
        if self.num_frames < 1 or self.tubelet_size < 1 or self.num_frames % self.tubelet_size:
            raise InputError(f"the tubelet depth {self.tubelet_size} does not divide {self.num_frames} frames "
                             "(num_frames must be a multiple of tubelet_size)")

    @property
    def grid3d(self) -> tuple[int, int, int]:
        return (self.num_frames // self.tubelet_size, *self.grid)

    @property
    def num_patches(self) -> int:
        d, h, w = self.grid3d
        return d * h * w

    def encoder(self, rngs) -> "VisionTransformer":
        from jepa_cli.models.block import use_attention
        from jepa_cli.models.vit import VisionTransformer

        return use_attention(VisionTransformer(
            image_size=as_pair(self.image_size), patch_size=self.patch_size, channels=self.channels,
            width=self.embed_dim, depth=self.encoder_depth, heads=self.num_heads,
            mlp_ratio=self.encoder_mlp_ratio, dtype=self.compute_dtype, rngs=rngs,
            num_frames=self.num_frames, tubelet_size=self.tubelet_size, scan_layers=self.scan_layers,
            remat=self.remat, **self._mixer_kwargs(self.encoder_mixers),
        ), self.attention_impl)

    def predictor(self, rngs, num_mask_tokens: int = 2) -> "VisionTransformerPredictor":
        from jepa_cli.models.block import use_attention
        from jepa_cli.models.vit import VisionTransformerPredictor

        return use_attention(VisionTransformerPredictor(
            grid=self.grid3d, embed_dim=self.embed_dim, width=self.pred_width, depth=self.pred_depth,
            heads=self.predictor_heads, mlp_ratio=4.0, dtype=self.compute_dtype, rngs=rngs,
            num_mask_tokens=num_mask_tokens, scan_layers=self.scan_layers, remat=self.remat,
            **self._mixer_kwargs(self.predictor_mixers),
        ), self.attention_impl)
