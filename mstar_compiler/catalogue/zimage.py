"""Z-Image family (flow-matching text-to-image): `zimage_text_encoder` and `zimage_dit`. Torch-free.

The text encoder is a Qwen3 LM read for its hidden states, not decoded: the caption rows are the output
of its next-to-last layer (transformers' `hidden_states[-2]`, what diffusers' ZImagePipeline reads), so
the module holds one layer fewer than the checkpoint and no final norm; its dims use the key names of
transformers' `Qwen3Config`. The denoiser is a single-stream DiT (dims: diffusers'
`ZImageTransformer2DModel` config) run once per flow-matching step: a node of it takes a request's
latent and caption rows and returns the latent one Euler step on. The VAE is BAGEL's `vae_decoder`
(the same FLUX autoencoder).
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


def encoder_params(d: Dims) -> int:
    """Exact parameter count of the runtime `zimage_text_encoder` module (all but the last layer)."""
    h, hd, inter = d["hidden_size"], d["head_dim"], d["intermediate_size"]
    q, kv = d["num_attention_heads"] * hd, d["num_key_value_heads"] * hd
    layer = 2 * h * q + 2 * h * kv + 2 * hd + 3 * h * inter + 2 * h
    return d["vocab_size"] * h + (d["num_hidden_layers"] - 1) * layer


_QWEN3 = {"rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "max_sequence_length": 512}
ENCODER_PRESETS = {
    "tiny": {**_QWEN3, "vocab_size": 512, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8},
    # CPU benchmarks (tools/bench/suite_dit.py): a 4-layer width-512 Qwen3 over the byte tokenizer
    "bench-mid": {**_QWEN3, "vocab_size": 512, "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4,
                  "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64},
    # Tongyi-MAI/Z-Image-Turbo's text_encoder/config.json (Qwen3-4B)
    "qwen3-4b": {**_QWEN3, "vocab_size": 151936, "hidden_size": 2560, "intermediate_size": 9728,
                 "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128},
}

_COMMON = {"in_channels": 16, "norm_eps": 1e-5, "rope_theta": 256.0, "t_scale": 1000.0}
PRESETS = {
    "tiny": {**_COMMON, "dim": 64, "n_layers": 2, "n_refiner_layers": 1, "n_heads": 2,
             "cap_feat_dim": 32, "axes_dims": [8, 12, 12], "axes_lens": [128, 64, 64]},
    # CPU benchmarks: 6 + 2 blocks of width 512, captions from the bench-mid text encoder
    "bench-mid": {**_COMMON, "dim": 512, "n_layers": 6, "n_refiner_layers": 1, "n_heads": 8, "cap_feat_dim": 512,
                  "axes_dims": [16, 24, 24], "axes_lens": [512, 128, 128]},
    # Tongyi-MAI/Z-Image-Turbo's transformer/config.json
    "turbo": {**_COMMON, "dim": 3840, "n_layers": 30, "n_refiner_layers": 2, "n_heads": 30, "cap_feat_dim": 2560,
              "axes_dims": [32, 48, 48], "axes_lens": [1536, 512, 512]},
}

ZIMAGE_TEXT_ENCODER = KindSpec(
    kind="zimage_text_encoder",
    doc="Z-Image's text encoder: a Qwen3 LM's next-to-last hidden states of the prompt (no decoding)",
    inputs=(Port("tokens", "tokens", ("T",)),),
    outputs=(Port("hidden", "hidden", ("T", "hidden_size")),),
    presets=ENCODER_PRESETS,
    num_params=encoder_params,
    can_batch=True,
    tp_divides=("num_attention_heads", "num_key_value_heads"),
    args={"weights": None, "seed": 0},
    executor="zimage_text_encoder",
)

ZIMAGE_DIT = KindSpec(
    kind="zimage_dit",
    doc="Z-Image single-stream DiT: a request's latent and caption rows -> its latent one Euler step on",
    inputs=(Port("latent", "latent", ("in_channels", "H", "W"), optional=True),   # the loop's carry; noise first
            Port("caption", "hidden", ("T", "cap_feat_dim"))),
    outputs=(Port("latent", "latent", ("in_channels", "H", "W")),),
    presets=PRESETS,
    num_params=dit_params,
    can_batch=True,
    tp_divides=("n_heads",),
    args={"weights": None, "seed": 0},
    executor="zimage_dit",
    layer_dim="n_layers",
)

KINDS: tuple[KindSpec, ...] = (ZIMAGE_TEXT_ENCODER, ZIMAGE_DIT)

# the family, declared once (runtime/models/zimage/); graphs/zimage.yaml adds BAGEL's `vae_decoder`
FAMILY = Family(
    "zimage", KINDS,
    components={"zimage_text_encoder": "runtime.models.zimage.zimage_text_encoder:ZImageTextEncoder",
                "zimage_dit": "runtime.models.zimage.zimage_dit:ZImageDiT"},
    executors={"zimage_text_encoder": "runtime.models.zimage.executors:text_encoder_executor",
               "zimage_dit": "runtime.models.zimage.executors:denoise_executor"},
    serving="runtime.models.zimage.serving:SERVING",
)
