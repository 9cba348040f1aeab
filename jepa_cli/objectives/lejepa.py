"""LeJEPA (Balestriero & LeCun 2025, arXiv 2511.08544), as rbalestr-lab/lejepa MINIMAL.md trains it.

Every example gives V views (global crops at the global size, local crops at local_size); one encoder
reads them all (one call per resolution, the same parameters), its mean-pooled tokens go through an MLP
projector, and the loss is (1 - lambda) x invariance + lambda x SIGReg: the invariance term pulls each
view's projection to the mean of its example's views, SIGReg (objectives/sigreg.py) pulls each view's
projections over the batch towards an isotropic Gaussian. No predictor, no EMA, no stop-gradient: the
one encoder is what encode-latents, the probes and export read.

The views follow the dataset's modality (lejepa_config.py): images and video clips are cut on the host
(data/transforms.py multi_view, clip_multi_view); an audio clip's log-mel is computed in the step and its
views are random resized crops of it along time and frequency (`spectrogram_views`), drawn from the
update's key.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jepa_cli.data import transforms
from jepa_cli.data.fbank import fbank
from jepa_cli.errors import InputError
from jepa_cli.models import ModuleTemplate
from jepa_cli.models.config import as_pair
from jepa_cli.objectives import telemetry
from jepa_cli.objectives.audio_jepa import normalise_waveform, to_float
from jepa_cli.objectives.base import decay_matrices_only
from jepa_cli.objectives.lejepa_config import LeJEPAConfig
from jepa_cli.objectives.sigreg import epps_pulley_sliced, random_directions

BN_EPS = 1e-5  # torch.nn.BatchNorm1d's default
LOCAL_SUFFIX = "_local"  # the batch entry of the local views: "image_local", "video_local"; the global views
# are under the modality's key ("image", "video")
VIEWS_STREAM = 2  # folded into the update's key: the audio views' crops (telemetry.SIGREG_STREAM is 1)


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


# -- the audio views ------------------------------------------------------------------------------

def crop_boxes(key, n: int, height: int, width: int, scale, ratio):
    """n random crop boxes (top, left, h, w) float32 [n, 4] of a height x width input: torchvision
    RandomResizedCrop's draw (area fraction ~ U(scale), log aspect w / h ~ U(log ratio)) in one try,
    the sides rounded and clipped to [1, the input's], the corner uniform where the box fits (its
    retries, data/transforms.py random_resized_crop_box, do not vectorise)."""
    k_area, k_aspect, k_top, k_left = jax.random.split(key, 4)
    area = height * width * jax.random.uniform(k_area, (n,), jnp.float32, scale[0], scale[1])
    aspect = jnp.exp(jax.random.uniform(k_aspect, (n,), jnp.float32, jnp.log(ratio[0]), jnp.log(ratio[1])))
    w = jnp.clip(jnp.round(jnp.sqrt(area * aspect)), 1, width)
    h = jnp.clip(jnp.round(jnp.sqrt(area / aspect)), 1, height)
    top = jnp.floor(jax.random.uniform(k_top, (n,)) * (height - h + 1))
    left = jnp.floor(jax.random.uniform(k_left, (n,)) * (width - w + 1))
    return jnp.stack([top, left, h, w], axis=-1)


def resized_crop(x, box, size: tuple[int, int]):
    """x [H, W] cropped to box (top, left, h, w) and resized to size (h', w'): bilinear, antialiased
    when shrinking (jax.image.scale_and_translate; as Pillow's box resize of the image views)."""
    top, left, h, w = box[0], box[1], box[2], box[3]
    scale = jnp.stack([size[0] / h, size[1] / w])
    translation = -jnp.stack([top, left]) * scale
    return jax.image.scale_and_translate(x, size, (0, 1), scale, translation, method="linear", antialias=True)


def spectrogram_views(spec, key, count: int, size: tuple[int, int], scale, ratio):
    """log-mel spectrograms [B, F, M] -> `count` random resized crops of each (crop_boxes, resized_crop)
    at size (frames, mel bins): [B, count, size[0], size[1], 1], crops along time and frequency at
    once (BYOL-A's Random Resize Crop of the log-mel, Niizumi et al. 2022)."""
    b, f, m = spec.shape
    boxes = crop_boxes(key, b * count, f, m, scale, ratio).reshape(b, count, 4)
    crop = jax.vmap(jax.vmap(lambda x, box: resized_crop(x, box, size), in_axes=(None, 0)))
    return crop(spec.astype(jnp.float32), boxes)[..., None]


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

    @property
    def modalities(self) -> tuple[str, ...]:
        """The one modality this objective's views are cut from (its `modality` option)."""
        return (self.config.modality,)

    @classmethod
    def dataset_options(cls, ds: dict) -> dict:
        """What the dataset implies: images' channels and size; clips' frames, frame size and channels;
        audio's sample rate and clip length; and the modality (last: the trainer adds these one by one)."""
        modality = ds["modality"]
        if modality == "image":
            out = {"channels": ds["channels"],
                   "image_size": ds["height"] if ds["height"] == ds["width"] else [ds["height"], ds["width"]]}
        elif modality == "video":
            t, h, w, c = ds["shape"]
            out = {"num_frames": t, "channels": c, "image_size": h if h == w else [h, w]}
        elif modality == "audio":
            rate = int(ds["attrs"].get("sample_rate") or 0)
            if rate <= 0:
                raise InputError("the audio dataset has no sample_rate attribute; ingest it again with jepa ingest")
            out = {"sample_rate": rate, "seconds": float(ds["shape"][0]) / rate}
        else:
            out = {}
        return {**out, "modality": modality}

    # the modules' templates are built on first use: validating options never traces a model
    @functools.cached_property
    def _encoder(self) -> ModuleTemplate:
        return ModuleTemplate(self.model_config.encoder)

    @functools.cached_property
    def _global_encoder(self) -> ModuleTemplate:
        """The same encoder's structure at the global views' size (a video's global_frames)."""
        return ModuleTemplate(self.config.global_model_config.encoder)

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
        """views [B, V, ...] (images [h, w, C], clips [t, h, w, C]) -> the encoder's mean-pooled
        last-layer tokens [B, V, D], float32."""
        b, v = views.shape[:2]
        tokens = template.merge(encoder_params)(views.reshape(b * v, *views.shape[2:]))  # [B V, T, D]
        return jnp.mean(tokens.astype(jnp.float32), axis=1).reshape(b, v, -1)

    def spectrogram(self, waves):
        """Audio: float32 waveforms [B, samples] -> the log-mel [B, frames, mel bins] (config.fbank_config),
        its frames cut at the end to whole patches (config.global_size)."""
        frames = self.config.global_size[0]
        return fbank(waves, self.config.fbank_config)[..., :frames, :]

    def views(self, batch: dict, key):
        """(global views [B, Vg, ...], local views [B, Vl, ...] or None) as the encoder reads them: the
        transform's (images, clips), or for audio `spectrogram_views` of the log-mel drawn from `key`."""
        c = self.config
        if c.modality != "audio":
            return batch[c.modality], batch.get(c.modality + LOCAL_SUFFIX)
        spec = self.spectrogram(batch["audio"])
        k_global, k_local = jax.random.split(key)
        views = spectrogram_views(spec, k_global, c.views_global, c.global_size, c.crop_scale, c.crop_ratio)
        if not c.views_local:
            return views, None
        return views, spectrogram_views(spec, k_local, c.views_local, c.local_size_pixels, c.local_scale,
                                        c.crop_ratio)

    def loss(self, params, ema, batch, key, step):
        c = self.config
        global_views, local_views = self.views(batch, jax.random.fold_in(key, VIEWS_STREAM))
        emb = self._pooled(self._global_encoder, params["encoder"], global_views)  # [B, Vg, D]
        if local_views is not None:
            local = self._pooled(self._local_encoder, params["encoder"], local_views)  # [B, Vl, D]
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
    def encode(self, encoder_params, inputs, last_layers: int = 1):
        """The encoder's tokens [B, T, D * last_layers] of images [B, H, W, C], clips [B, T, H, W, C] or
        (audio) waveforms [B, samples], read whole: the image, the clip, the log-mel."""
        enc = self._encoder.merge(encoder_params)
        if self.config.modality == "audio":
            inputs = self.spectrogram(inputs)[..., None]
        return enc(inputs, last_layers=last_layers).astype(jnp.float32)

    def _waveform(self):
        """Audio: each clip centre-cropped or zero-padded to the clip length, then Audio-JEPA's waveform
        normalisation (mean removed, peak 1), on the host."""
        from jepa_cli.data.audio import fit_length

        samples = self.config.clip_samples

        def transform(example: dict, rng: np.random.Generator | None = None) -> dict:
            wave = fit_length(to_float(example["audio"]), samples, "center")
            return {**example, "audio": normalise_waveform(wave)}

        return transform

    def train_transform(self, image_size=None, on_device: bool = False):
        """The multi-view transform: images (data/transforms.py multi_view) with global views under
        "image" [Vg, H, W, C] and local views under "image_local" [Vl, h, w, C]; clips (clip_multi_view)
        under "video" [Vg, global_frames, H, W, C] and "video_local"; audio clips as normalised
        waveforms, whose views the step cuts (`views`). Everything is normalised on the host
        (`on_device` has no device part here, so the trainer refuses --device-normalise)."""
        c = self.config
        c.check_views_fit()
        if c.modality == "audio":
            return self._waveform()
        size = as_pair(image_size or c.image_size)
        video = c.modality == "video"
        views = (transforms.ViewSpec(c.views_global, size, c.crop_scale, c.global_frames_count if video else None),
                 transforms.ViewSpec(c.views_local, c.local_size_pixels, c.local_scale,
                                     c.local_frames_count if video else None))
        make = transforms.clip_multi_view if video else transforms.multi_view
        return make(views, (c.modality, c.modality + LOCAL_SUFFIX), c.norm_mean, c.norm_std, c.crop_ratio, c.hflip,
                    c.jitter_prob, c.jitter, c.grayscale_prob)

    def eval_transform(self, image_size=None):
        """The whole example as `encode` reads it: an image or every frame of a clip resized and centre
        cropped (eval_resize_ratio), normalised; an audio clip as `train_transform`'s waveform."""
        c = self.config
        if c.modality == "audio":
            return self._waveform()
        make = transforms.clip_resize_center_crop if c.modality == "video" else transforms.resize_center_crop
        return make(image_size or c.image_size, c.norm_mean, c.norm_std, c.eval_resize_ratio)
