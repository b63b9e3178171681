"""Z-Image family (flow-matching text-to-image): `zimage_dit`, its single-stream diffusion transformer. Torch-free.

Dims use the key names of diffusers' `ZImageTransformer2DModel` config. The text encoder (a Qwen3 LM's
hidden states) and the VAE (FLUX's autoencoder) are other families' kinds.
"""
from __future__ import annotations

from mstar_compiler.catalogue import Dims, Family, KindSpec, Port

ADALN_DIM = 256
PATCH = 2


def _block(d: Dims, modulation: bool) -> int:
    dim = d["dim"]
    head_dim = dim // d["n_heads"]
    hidden = int(dim / 3 * 8)
    params = 4 * dim * dim + 2 * head_dim + 3 * dim * hidden + 4 * dim
    return params + ((min(dim, ADALN_DIM) + 1) * 4 * dim if modulation else 0)


def dit_params(d: Dims) -> int:
    """Exact parameter count of the runtime `zimage_dit` module."""
    dim, patch, adaln = d["dim"], PATCH * PATCH * d["in_channels"], min(d["dim"], ADALN_DIM)
    embed = (patch + 1) * dim
    final = (dim + 1) * patch + (adaln + 1) * dim
    refiners = d["n_refiner_layers"] * (_block(d, True) + _block(d, False))
    t_embedder = (256 + 1) * 1024 + (1024 + 1) * adaln
    caption = d["cap_feat_dim"] + (d["cap_feat_dim"] + 1) * dim
    return embed + final + refiners + t_embedder + caption + 2 * dim + d["n_layers"] * _block(d, True)


_COMMON = {"in_channels": 16, "norm_eps": 1e-5, "rope_theta": 256.0, "t_scale": 1000.0}
PRESETS = {
    "tiny": {**_COMMON, "in_channels": 4, "dim": 64, "n_layers": 2, "n_refiner_layers": 1, "n_heads": 2,
             "cap_feat_dim": 32, "axes_dims": [8, 12, 12], "axes_lens": [128, 64, 64]},
    # Tongyi-MAI/Z-Image-Turbo's transformer/config.json
    "turbo": {**_COMMON, "dim": 3840, "n_layers": 30, "n_refiner_layers": 2, "n_heads": 30, "cap_feat_dim": 2560,
              "axes_dims": [32, 48, 48], "axes_lens": [1536, 512, 512]},
}

ZIMAGE_DIT = KindSpec(
    kind="zimage_dit",
    doc="Z-Image single-stream DiT: latent + timestep + caption rows -> the flow-matching model output",
    inputs=(Port("latent", "latent", ("in_channels", "H", "W")), Port("timestep", "scalar", ()),
            Port("caption", "hidden", ("T", "cap_feat_dim"))),
    outputs=(Port("velocity", "velocity", ("in_channels", "H", "W")),),
    presets=PRESETS,
    num_params=dit_params,
    can_batch=True,
    tp_divides=("n_heads",),
    args={"weights": None, "seed": 0},
    layer_dim="n_layers",
)

KINDS: tuple[KindSpec, ...] = (ZIMAGE_DIT,)

# the family, declared once (runtime/models/zimage/): its denoiser so far; its graph, executor and serving
# are not written yet
FAMILY = Family("zimage", KINDS, components={"zimage_dit": "runtime.models.zimage.zimage_dit:ZImageDiT"})
