"""I-JEPA's options (IJEPAConfig): the model's, the masks' and the objective's own, declared once
(jepa_cli/options.py). No JAX here, so `jepa train` reads the flags before JAX loads."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from jepa_cli.errors import InputError
from jepa_cli.fieldtypes import check_field_types
from jepa_cli.models.config import ModelConfig
from jepa_cli.names import LOSSES
from jepa_cli.options import option


def default_norm(channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) when a recipe gives none: ImageNet's for 3 channels, 0.5 per channel otherwise."""
    from jepa_cli.data.transforms import IMAGENET_MEAN, IMAGENET_STD  # numpy and PIL: only when used

    return (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else ((0.5,) * channels, (0.5,) * channels)


def _tuplify(v):
    if isinstance(v, list):
        return tuple(_tuplify(x) for x in v)
    return v


# The objectives that take the anti-collapse terms (var_weight, var_target, cov_weight and the sigreg_*
# options): declared once, as IJEPAConfig's fields, and reused by the others with option_of.
JEPA_OBJECTIVES = ("ijepa", "vjepa", "audio-jepa")
# The objectives that take the sigreg_* options: the JEPA objectives' anti-collapse term, LeJEPA's loss
SIGREG_OBJECTIVES = JEPA_OBJECTIVES + ("lejepa",)
# What the JEPA objectives' SIGReg is taken over (objectives/telemetry.py sigreg_samples): the context
# encoder's pooled features (one sample per example), every valid context token, every valid predicted token
SIGREG_PLACEMENTS = ("pooled", "tokens", "predictions")


def check_anticollapse(config) -> None:
    """InputError unless the anti-collapse weights are >= 0, var_target > 0 (a target of 0 would make
    the variance term 0 whatever the features), the sigreg_* options valid (check_sigreg) and sigreg_on
    one of SIGREG_PLACEMENTS; call after check_field_types (non-finite values)."""
    for name in ("var_weight", "var_target", "cov_weight"):
        if getattr(config, name) < 0.0:
            raise InputError(f"{name} must be >= 0, got {getattr(config, name)!r}")
    if config.var_target == 0.0:
        raise InputError(f"var_target must be > 0 (the batch std the variance term asks for), got {config.var_target!r}")
    check_sigreg(config)
    if config.sigreg_on not in SIGREG_PLACEMENTS:
        raise InputError(f"unknown sigreg_on {config.sigreg_on!r} (choose from {', '.join(SIGREG_PLACEMENTS)})")


def check_sigreg(config) -> None:
    """InputError unless sigreg_weight is in [0, 1], sigreg_slices >= 1, sigreg_knots >= 2 and
    sigreg_t_max > 0; call after check_field_types (non-finite values)."""
    if not 0.0 <= config.sigreg_weight <= 1.0:
        raise InputError(f"sigreg_weight must be in [0, 1], got {config.sigreg_weight!r}")
    for name, least in (("sigreg_slices", 1), ("sigreg_knots", 2)):  # 2 knots: one trapezoid step
        if getattr(config, name) < least:
            raise InputError(f"{name} must be >= {least}, got {getattr(config, name)!r}")
    if not config.sigreg_t_max > 0.0:
        raise InputError(f"sigreg_t_max must be > 0, got {config.sigreg_t_max!r}")


class EncoderPredictorOptions:
    """What the JEPA objectives' configs share (I-JEPA's here, V-JEPA's in objectives/vjepa.py): the
    mask options held as sorted (name, value) pairs, the recipe form (from_dict / to_dict), the input
    normalisation and the checks of the EMA range, its length and the statistics. A subclass names
    its objective (`owner`), its mask strategy (`mask_strategy`, a masks/config.py CONFIGS key) and the
    mask fields its model supplies (`mask_fields_from_model`)."""

    owner: ClassVar[str]
    mask_strategy: ClassVar[str]
    mask_fields_from_model: ClassVar[frozenset[str]]

    @classmethod
    def mask_fields(cls) -> set[str]:
        """The fields of the strategy's mask config that a recipe may set."""
        from jepa_cli.masks.config import CONFIGS

        return {f.name for f in dataclasses.fields(CONFIGS[cls.mask_strategy])} - cls.mask_fields_from_model

    def _normalise_and_check(self) -> None:
        """Tuples for lists (TOML has none), mask_options as sorted pairs, field types, then the
        shared ranges; call first in __post_init__."""
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _tuplify(getattr(self, f.name)))
        if isinstance(self.mask_options, dict):
            object.__setattr__(self, "mask_options", tuple(sorted(self.mask_options.items())))
        object.__setattr__(self, "mask_options", tuple((k, _tuplify(v)) for k, v in self.mask_options))
        check_field_types(self, self.owner)  # before any check below compares or measures a value
        if len(self.ema) != 2 or not all(0.0 <= m <= 1.0 for m in self.ema):
            raise InputError(f"ema must be two momenta in [0, 1], got {self.ema!r}")
        if self.total_updates is not None and self.total_updates < 0:
            raise InputError(f"total_updates must be >= 0, got {self.total_updates}")
        for name in ("mean", "std"):
            v = getattr(self, name)
            if v is not None and len(v) not in (1, self.channels):
                raise InputError(f"{name} needs 1 or {self.channels} values, got {len(v)}")

    @property
    def norm_mean(self) -> tuple[float, ...]:
        return self.mean if self.mean is not None else default_norm(self.channels)[0]

    @property
    def norm_std(self) -> tuple[float, ...]:
        return self.std if self.std is not None else default_norm(self.channels)[1]

    @classmethod
    def from_dict(cls, config: dict):
        """Flat options; keys that are `mask_fields()` go to mask_options (a "mask" key may also hold
        a dict of them). Any other unknown key is an InputError naming it and the objective."""
        own = {f.name for f in dataclasses.fields(cls)}
        mask_fields = cls.mask_fields()
        kwargs: dict[str, Any] = {}
        masks = dict(config.get("mask") or {})
        masks.update(dict(config.get("mask_options") or ()))
        for k, v in config.items():
            if k in ("mask", "mask_options"):
                continue
            if k in own:
                kwargs[k] = v
            elif k in mask_fields:
                masks[k] = v
            else:
                raise InputError(f"unknown {cls.owner} option {k!r}")
        for k in masks:
            if k not in mask_fields:
                raise InputError(f"unknown {cls.owner} mask option {k!r}")
        kwargs["mask_options"] = tuple(sorted((k, _tuplify(v)) for k, v in masks.items()))
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """As run.json and TOML hold it: tuples as lists, mask_options as a table."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "mask_options":
                v = {k: _listify(x) for k, x in v}
            out[f.name] = _listify(v)
        return out


@dataclasses.dataclass(frozen=True)
class IJEPAConfig(ModelConfig, EncoderPredictorOptions):
    """The model's fields (inherited from ModelConfig, flat so that TOML keys stay flat), the masks
    and the objective's own options."""

    # masks: overrides of jepa_cli.masks.MultiBlockConfig fields (grid comes from the model),
    # as sorted (name, value) pairs so the config stays hashable; TOML writes them flat
    mask_options: tuple[tuple[str, Any], ...] = ()
    # objective (ijepa configs/in1k_vith14_ep300.yaml, src/train.py)
    loss: str = option("smooth_l1", "Prediction loss: smooth_l1 (official code) | l2 (paper) | l1.", flag=True,
                       choices=LOSSES)
    ema: tuple[float, float] = option((0.996, 1.0), "Target-encoder EMA momentum ramp START,END over the run.",
                                      flag=True, applies=JEPA_OBJECTIVES, metavar="START,END")
    total_updates: float | None = option(None, "EMA ramp length in updates, steps x ipe_scale unrounded "
                                               "(default: set by the trainer).")
    mean: tuple[float, ...] | None = option(None, "Per-channel normalisation mean (default: ImageNet's for 3 "
                                                  "channels, 0.5 otherwise).")
    std: tuple[float, ...] | None = option(None, "Per-channel normalisation std (default: ImageNet's for 3 "
                                                 "channels, 0.5 otherwise).")
    crop_scale: tuple[float, float] = option((0.3, 1.0), "Random resized crop: area scale LO,HI.")
    crop_ratio: tuple[float, float] = option((3 / 4, 4 / 3), "Random resized crop: aspect ratio LO,HI.")
    # anti-collapse terms (not in the official recipe; 0 = off): VICReg's variance and covariance terms
    # (Bardes et al. 2022, eq. 1 and 3) on the context encoder's mean-pooled features, as C-JEPA adds
    # them to I-JEPA (Mo & Tong 2024); every JEPA objective takes them (JEPA_OBJECTIVES)
    var_weight: float = option(0.0, "Weight of the variance term: mean over channels of relu(var_target - "
                                    "std), the batch std of the context encoder's mean-pooled features "
                                    "(VICReg); 0: the official recipe.", flag=True, applies=JEPA_OBJECTIVES)
    var_target: float = option(1.0, "Target std of the variance term (VICReg's gamma), > 0.", flag=True,
                               applies=JEPA_OBJECTIVES)
    cov_weight: float = option(0.0, "Weight of the covariance term: the squared off-diagonal entries of "
                                    "the pooled features' batch covariance, summed, over the width "
                                    "(VICReg); 0: off.", flag=True, applies=JEPA_OBJECTIVES)
    # SIGReg (LeJEPA, Balestriero & LeCun 2025; objectives/sigreg.py), by default on the same pooled
    # features, its weight LeJEPA's lambda in [0, 1]; defaults rbalestr-lab/lejepa
    # lejepa/univariate/epps_pulley.py (t_max 3, 17 knots) and MINIMAL.md (256 slices)
    sigreg_weight: float = option(0.0, "Weight of SIGReg (LeJEPA's lambda), in [0, 1]: the Epps-Pulley statistic "
                                       "of embeddings projected on random directions, against a standard normal. "
                                       "The JEPA objectives add it on what sigreg_on names, by default the "
                                       "context encoder's mean-pooled features (0: off); lejepa's loss is "
                                       "(1 - it) x invariance + it x SIGReg of the projections (lejepa's "
                                       "default 0.05).", flag=True, applies=SIGREG_OBJECTIVES)
    sigreg_slices: int = option(256, "SIGReg: random unit directions, drawn anew each update.", flag=True,
                                applies=SIGREG_OBJECTIVES)
    sigreg_knots: int = option(17, "SIGReg: knots of the trapezoid rule on [0, sigreg_t_max], >= 2.", flag=True,
                               applies=SIGREG_OBJECTIVES)
    sigreg_t_max: float = option(3.0, "SIGReg: the characteristic functions are compared for |t| up to this, > 0.",
                                 flag=True, applies=SIGREG_OBJECTIVES)
    sigreg_on: str = option("pooled", "What the JEPA objectives' SIGReg is taken over: pooled (the context "
                                      "encoder's mean-pooled features, one sample per example) | tokens (every "
                                      "valid context token) | predictions (every valid predicted token).",
                            flag=True, applies=JEPA_OBJECTIVES, choices=SIGREG_PLACEMENTS)
    # 256/224 is the usual Resize(256) + CenterCrop(224)
    eval_resize_ratio: float = option(256 / 224, "Evaluation (encode-latents): resize the short side to "
                                                 "image_size x this, then centre-crop; 1.0 keeps the whole image.")

    def __post_init__(self):
        self._normalise_and_check()
        if self.loss not in LOSSES:
            raise InputError(f"unknown loss {self.loss!r} (choose from {', '.join(LOSSES)})")
        check_anticollapse(self)
        if not self.eval_resize_ratio >= 1.0:
            raise InputError(f"eval_resize_ratio must be >= 1 (1: no border cropped), got {self.eval_resize_ratio!r}")
        super().__post_init__()  # validates the model fields

    @property
    def model_config(self) -> ModelConfig:
        return ModelConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ModelConfig)})

    @property
    def mask_config(self):
        from jepa_cli.masks import MultiBlockConfig
        from jepa_cli.masks.checks import validate, validate_token_grid

        model, p = self.model_config, self.model_config.patch_size
        return validate_token_grid(lambda grid: validate(MultiBlockConfig(grid=grid, **dict(self.mask_options))),
                                   self, tuple(g * p for g in model.grid), (p, p), "images",
                                   ("image_size", "patch_size"))

    owner: ClassVar[str] = "ijepa"
    mask_strategy: ClassVar[str] = "multiblock"
    mask_fields_from_model: ClassVar[frozenset[str]] = frozenset({"grid"})


def _listify(v):
    if isinstance(v, tuple):
        return [_listify(x) for x in v]
    return v
