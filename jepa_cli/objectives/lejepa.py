"""LeJEPA (Balestriero & LeCun 2025, arXiv 2511.08544), as rbalestr-lab/lejepa MINIMAL.md trains it.

Every example gives V views (global crops at image_size, local crops at local_size); one encoder reads
them all (one call per resolution, the same parameters), its mean-pooled tokens go through an MLP
projector, and the loss is (1 - lambda) x invariance + lambda x SIGReg: the invariance term pulls each
view's projection to the mean of its example's views, SIGReg (objectives/sigreg.py) pulls each view's
projections over the batch towards an isotropic Gaussian. No predictor, no EMA, no stop-gradient: the
one encoder is what encode-latents, the probes and export read.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jepa_cli.data import transforms
from jepa_cli.models import ModuleTemplate
from jepa_cli.models.config import as_pair
from jepa_cli.objectives import telemetry
from jepa_cli.objectives.base import decay_matrices_only
from jepa_cli.objectives.lejepa_config import LeJEPAConfig
from jepa_cli.objectives.sigreg import epps_pulley_sliced, random_directions

BN_EPS = 1e-5  # torch.nn.BatchNorm1d's default
LOCAL_KEY = "image_local"  # the batch entry of the local views; the global views are under "image"


# -- the loss, pure functions ------------------------------------------------------------------------

def invariance(proj):
    """proj [V, N, K] -> the mean over views, examples and features of the squared distance of each
    view's projection to the mean of its example's views (MINIMAL.md: (proj.mean(0) - proj).square().mean())."""
    proj = jnp.asarray(proj, jnp.float32)
    return jnp.mean(jnp.square(jnp.mean(proj, axis=0, keepdims=True) - proj))


def sigreg_views(proj, key, num_slices: int, num_knots: int, t_max: float):
    """proj [V, N, K] -> SIGReg of each view's N projections on the same num_slices directions, averaged
    over the views (MINIMAL.md SIGReg.forward on [V, N, K]: one draw of directions, means over N)."""
    directions = random_directions(key, proj.shape[-1], num_slices)  # [K, M]
    per_view = jax.vmap(lambda p: epps_pulley_sliced(p, directions, num_knots, t_max))(proj)  # [V]
    return jnp.mean(per_view)


def lejepa_loss(proj, key, weight: float, num_slices: int, num_knots: int, t_max: float):
    """(loss, invariance, SIGReg) of projections [V, N, K]: loss = (1 - weight) x invariance + weight x
    SIGReg (MINIMAL.md: sigreg_loss * lamb + inv_loss * (1 - lamb))."""
    inv = invariance(proj)
    reg = sigreg_views(proj, key, num_slices, num_knots, t_max)
    return (1.0 - weight) * inv + weight * reg, inv, reg


# -- the projector ---------------------------------------------------------------------------------

def projector_init(key, dims: tuple[int, ...]) -> dict:
    """An MLP's parameters {"linear{i}": {kernel [d_in, d_out], bias}, "norm{i}": {scale, bias}} for
    dims (d_0 = the input width, then the layers'), torch.nn.Linear's initialisation: kernel and bias
    U(-1/sqrt(d_in), 1/sqrt(d_in)); BatchNorm scale 1, bias 0, after every layer but the last."""
    params = {}
    keys = jax.random.split(key, len(dims) - 1)
    for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
        k_w, k_b = jax.random.split(keys[i])
        bound = 1.0 / float(d_in) ** 0.5
        params[f"linear{i}"] = {"kernel": jax.random.uniform(k_w, (d_in, d_out), jnp.float32, -bound, bound),
                                "bias": jax.random.uniform(k_b, (d_out,), jnp.float32, -bound, bound)}
        if i < len(dims) - 2:
            params[f"norm{i}"] = {"scale": jnp.ones((d_out,), jnp.float32), "bias": jnp.zeros((d_out,), jnp.float32)}
    return params


def batch_norm(x, scale, bias, eps: float = BN_EPS):
    """BatchNorm1d in training mode on x [N, D]: the batch's mean and (biased) variance, then the affine.
    The projector serves the loss only, so no running statistics are kept."""
    mean = jnp.mean(x, axis=0, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=0, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * scale + bias


def projector_apply(params: dict, x):
    """x [N, D] -> [N, K]: torchvision.ops.MLP(D, dims, norm_layer=BatchNorm1d) of MINIMAL.md (Linear,
    BatchNorm, ReLU between layers; the last Linear alone)."""
    layers = sum(1 for name in params if name.startswith("linear"))
    for i in range(layers):
        x = x @ params[f"linear{i}"]["kernel"] + params[f"linear{i}"]["bias"]
        if i < layers - 1:
            x = jax.nn.relu(batch_norm(x, params[f"norm{i}"]["scale"], params[f"norm{i}"]["bias"]))
    return x


# -- the objective -----------------------------------------------------------------------------------

class LeJEPAObjective:
    name = "lejepa"

    def __init__(self, config: LeJEPAConfig | None = None):
        self.config = config or LeJEPAConfig()
        self.model_config = self.config.model_config

    @classmethod
    def from_config(cls, config: dict) -> "LeJEPAObjective":
        return cls(LeJEPAConfig.from_dict(config))

    def to_config(self) -> dict:
        return self.config.to_dict()

    # the modules' templates are built on first use: validating options never traces a model
    @functools.cached_property
    def _encoder(self) -> ModuleTemplate:
        return ModuleTemplate(self.model_config.encoder)

    @functools.cached_property
    def _local_encoder(self) -> ModuleTemplate:
        """The same encoder's structure at the local views' size (parameters of the same shapes)."""
        return ModuleTemplate(self.config.local_model_config.encoder)

    # -- parameters ------------------------------------------------------------------------------
    def init(self, key):
        k_enc, k_proj = jax.random.split(key)
        dims = (self.model_config.embed_dim, *self.config.proj_dims)
        return {"encoder": self._encoder.init(k_enc), "projector": projector_init(k_proj, dims)}

    @property
    def ema_spec(self):
        """None: LeJEPA keeps no EMA (MINIMAL.md: no teacher-student); the trainer averages nothing."""
        return None

    def weight_decay_mask(self, params):
        """AdamW decays matrices only (not biases, not 1-D leaves), the rule of the JEPA objectives."""
        return decay_matrices_only(params)

    # -- training --------------------------------------------------------------------------------
    def _pooled(self, template: ModuleTemplate, encoder_params, views):
        """views [B, V, h, w, C] -> the encoder's mean-pooled last-layer tokens [B, V, D], float32."""
        b, v = views.shape[:2]
        tokens = template.merge(encoder_params)(views.reshape(b * v, *views.shape[2:]))  # [B V, T, D]
        return jnp.mean(tokens.astype(jnp.float32), axis=1).reshape(b, v, -1)

    def loss(self, params, ema, batch, key, step):
        c = self.config
        emb = self._pooled(self._encoder, params["encoder"], batch["image"])  # [B, Vg, D]
        if LOCAL_KEY in batch:
            local = self._pooled(self._local_encoder, params["encoder"], batch[LOCAL_KEY])  # [B, Vl, D]
            emb_all = jnp.concatenate([emb, local], axis=1)  # [B, V, D]
        else:
            emb_all = emb
        b, v, d = emb_all.shape
        proj = projector_apply(params["projector"], emb_all.reshape(b * v, d))  # [B V, K]
        proj = proj.reshape(b, v, -1).transpose(1, 0, 2)  # [V, B, K]
        value, inv, reg = lejepa_loss(proj, jax.random.fold_in(key, telemetry.SIGREG_STREAM), c.sigreg_weight,
                                      c.sigreg_slices, c.sigreg_knots, c.sigreg_t_max)
        first = emb[:, 0]  # [B, D]: the first global view's embeddings, for the collapse telemetry
        aux = {"loss": value, "inv_loss": inv, "sigreg": reg, **telemetry.collapse_metrics(first, first),
               "proj_std": telemetry.repr_std(jax.lax.stop_gradient(proj.reshape(v * b, -1)))}
        return value, aux

    # -- evaluation ------------------------------------------------------------------------------
    def encode(self, encoder_params, images, last_layers: int = 1):
        enc = self._encoder.merge(encoder_params)
        return enc(images, last_layers=last_layers).astype(jnp.float32)

    def train_transform(self, image_size=None, on_device: bool = False):
        """The multi-view transform (data/transforms.py multi_view): global views under "image" [Vg, H, W,
        C], local views under "image_local" [Vl, h, w, C]. The pixels are normalised on the host
        (`on_device` has no device part here, so the trainer refuses --device-normalise)."""
        c = self.config
        size = as_pair(image_size or c.image_size)
        views = (transforms.ViewSpec(c.views_global, size, c.crop_scale),
                 transforms.ViewSpec(c.views_local, c.local_size_pixels, c.local_scale))
        return transforms.multi_view(views, ("image", LOCAL_KEY), c.norm_mean, c.norm_std, c.crop_ratio, c.hflip,
                                     c.jitter_prob, c.jitter, c.grayscale_prob)

    def eval_transform(self, image_size=None):
        c = self.config
        return transforms.resize_center_crop(image_size or c.image_size, c.norm_mean, c.norm_std,
                                             c.eval_resize_ratio)
