"""Catalogue family `bagel`: the components of BAGEL-7B-MoT (torch-free).

Five kinds, implemented in `runtime/model_executor/components/<kind>.py`:
  * `siglip_vit`   — SigLIP vision tower + BAGEL's connector MLP and 2-D position
                     embedding: an image becomes LLM-width embeddings;
  * `vae_encoder`  — FLUX VAE encoder: an image becomes a 16-channel latent;
  * `vae_decoder`  — FLUX VAE decoder: a latent becomes an image;
  * `bagel_mot_lm` — Qwen2.5 backbone with the mixture-of-transformers generation expert
                     (prompt prefill, text decode, velocity prediction for latent tokens);
  * `cfg_combine`  — classifier-free guidance combine + renorm + Euler step (no weights).

Every `num_params` below is the exact parameter count of the runtime module built from
the same dims (tests/runtime/models/test_registry_matches_catalogue.py checks the tiny and
bench-mid presets).
"""
from __future__ import annotations

from mstar_compiler.catalogue import Dims, Family, KindSpec, Linear, Port
from mstar_compiler.catalogue.decoder_lm import attention_linears, swiglu_linears

# ---------------------------------------------------------------------------- siglip_vit

_SIGLIP_TINY = {
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 2, "patch_size": 14, "num_channels": 3,
    "max_num_patch_per_side": 4, "layer_norm_eps": 1e-6, "llm_hidden_size": 64,
}
# `bench-mid`: the tiny tower feeding the bench-mid LM (width 512); the LM dominates a T2I step
_SIGLIP_BENCH_MID = {**_SIGLIP_TINY, "llm_hidden_size": 512}
# SigLIP so400m/14 as BAGEL uses it: image_size 980 (70 patches a side), last layer dropped.
_SIGLIP_BAGEL = {
    "hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 26,
    "num_attention_heads": 16, "patch_size": 14, "num_channels": 3,
    "max_num_patch_per_side": 70, "layer_norm_eps": 1e-6, "llm_hidden_size": 3584,
}


def _siglip_params(d: Dims) -> int:
    h, i, e = d["hidden_size"], d["intermediate_size"], d["llm_hidden_size"]
    side2 = d["max_num_patch_per_side"] ** 2
    patch_in = d["num_channels"] * d["patch_size"] ** 2
    embeddings = patch_in * h + h + side2 * h            # patch linear + learned positions
    layer = 4 * h + 4 * (h * h + h) + (h * i + i) + (i * h + h)
    connector = h * e + e + e * e + e                   # fc1, fc2
    return embeddings + d["num_hidden_layers"] * layer + 2 * h + connector + side2 * e


# ------------------------------------------------------------------- vae_encoder/decoder

_VAE_TINY = {
    "in_channels": 3, "latent_channels": 16, "block_out_channels": (16, 16, 32, 32),
    "layers_per_block": 1, "norm_num_groups": 8,
}
_VAE_FLUX = {
    "in_channels": 3, "latent_channels": 16, "block_out_channels": (128, 256, 512, 512),
    "layers_per_block": 2, "norm_num_groups": 32,
}
# FLUX's latent normalisation: encoder returns scaling * (z - shift); decoder inverts it.
_VAE_ARGS = {"scaling_factor": 0.3611, "shift_factor": 0.1159}


def _resnet(cin: int, cout: int) -> int:
    shortcut = cin * cout + cout if cin != cout else 0
    return 2 * cin + (9 * cin * cout + cout) + 2 * cout + (9 * cout * cout + cout) + shortcut


def _mid_block(c: int) -> int:
    attention = 2 * c + 4 * (c * c + c)                 # group_norm, to_q/k/v, to_out.0
    return 2 * _resnet(c, c) + attention


def _vae_encoder_params(d: Dims) -> int:
    ch, n, z = d["block_out_channels"], d["layers_per_block"], d["latent_channels"]
    total = 9 * d["in_channels"] * ch[0] + ch[0]
    prev = ch[0]
    for level, c in enumerate(ch):
        total += _resnet(prev, c) + (n - 1) * _resnet(c, c)
        if level < len(ch) - 1:
            total += 9 * c * c + c                      # stride-2 downsample conv
        prev = c
    return total + _mid_block(ch[-1]) + 2 * ch[-1] + 9 * ch[-1] * 2 * z + 2 * z


def _vae_decoder_params(d: Dims) -> int:
    ch, n, z = d["block_out_channels"][::-1], d["layers_per_block"], d["latent_channels"]
    total = 9 * z * ch[0] + ch[0] + _mid_block(ch[0])
    prev = ch[0]
    for level, c in enumerate(ch):
        total += _resnet(prev, c) + n * _resnet(c, c)
        if level < len(ch) - 1:
            total += 9 * c * c + c                      # upsample conv
        prev = c
    return total + 2 * ch[-1] + 9 * ch[-1] * d["in_channels"] + d["in_channels"]


# ------------------------------------------------------------------------ bagel_mot_lm

_LM_TINY = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 512, "rope_theta": 1e6, "rms_norm_eps": 1e-6, "qk_norm": True,
    "latent_channels": 16, "latent_patch_size": 2, "max_latent_size": 8,
    "timestep_embedding_dim": 256,
    "bos_token_id": 500, "eos_token_id": 501, "start_of_image_id": 502, "end_of_image_id": 503,
}
# `bench-mid`: between tiny (Python overhead) and 7B (too big for a 2-core CPU), so that served
# benchmarks compare compute: 6 layers of width 512, latent grid up to 16 x 16 (256 x 256 images)
_LM_BENCH_MID = {
    **_LM_TINY, "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 6,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64, "max_latent_size": 16,
}
# Qwen2.5-7B per expert; special ids are Qwen2's <|im_start|>, <|im_end|>, <|vision_start|>, <|vision_end|>.
_LM_BAGEL = {
    "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "head_dim": 128,
    "vocab_size": 152064, "rope_theta": 1e6, "rms_norm_eps": 1e-6, "qk_norm": True,
    "latent_channels": 16, "latent_patch_size": 2, "max_latent_size": 64,
    "timestep_embedding_dim": 256,
    "bos_token_id": 151644, "eos_token_id": 151645,
    "start_of_image_id": 151652, "end_of_image_id": 151653,
}


def _expert_layer_params(d: Dims) -> int:
    """One layer's weights of one expert (understanding or generation)."""
    h, i, hd = d["hidden_size"], d["intermediate_size"], d["head_dim"]
    q, kv = d["num_attention_heads"] * hd, d["num_key_value_heads"] * hd
    attention = (h * q + q) + 2 * (h * kv + kv) + q * h + (2 * hd if d["qk_norm"] else 0)
    return attention + 3 * h * i + 2 * h                # + gate/up/down, 2 RMSNorms


def _mot_quant_linears(d: Dims) -> list[Linear]:
    """Both experts' attention and MLP linears of every layer (mstar_compiler.quant)."""
    expert = attention_linears(d) + swiglu_linears(d["hidden_size"], d["intermediate_size"])
    return [Linear(lin.n, lin.k, 2 * d["num_hidden_layers"], lin.splits_input) for lin in expert]


def _mot_lm_params(d: Dims) -> int:
    h, v, f = d["hidden_size"], d["vocab_size"], d["timestep_embedding_dim"]
    patch_dim = d["latent_patch_size"] ** 2 * d["latent_channels"]
    llm = 2 * v * h + 2 * h + 2 * d["num_hidden_layers"] * _expert_layer_params(d)
    time_embedder = f * h + h + h * h + h
    projections = (patch_dim * h + h) + (h * patch_dim + patch_dim)  # vae2llm, llm2vae
    return llm + time_embedder + projections + d["max_latent_size"] ** 2 * h


def _kv_bytes(d: Dims, dtype_bytes: int) -> int:
    return 2 * d["num_hidden_layers"] * d["num_key_value_heads"] * d["head_dim"] * dtype_bytes


# ------------------------------------------------------------------------- cfg_combine

_CFG_DIMS = {"latent_channels": 16, "latent_patch_size": 2}

# args of every kind with weights (same meaning as the decoder_lm family's)
_WEIGHT_ARGS = {
    "weights": None,   # safetensors file or directory (HF / BAGEL layout); None: seeded random weights
    "seed": 0,         # seed of the random weights when `weights` is None
}

_LATENT = ("latent_channels", "h", "w")

KINDS: tuple[KindSpec, ...] = (
    KindSpec(
        kind="siglip_vit",
        executor="bagel_image_encoder",
        doc="SigLIP vision tower + BAGEL connector: image -> LLM-width embeddings",
        inputs=(Port("image", "image", (3, "H", "W")),),
        outputs=(Port("hidden", "hidden", ("T", "llm_hidden_size")),),
        presets={"tiny": _SIGLIP_TINY, "bench-mid": _SIGLIP_BENCH_MID, "bagel-7b": _SIGLIP_BAGEL},
        num_params=_siglip_params,
        tp_divides=("num_attention_heads",),
        args=_WEIGHT_ARGS,
    ),
    KindSpec(
        kind="vae_encoder",
        executor="bagel_image_encoder",
        doc="FLUX VAE encoder: image -> scaled, shifted 16-channel latent (8x down)",
        inputs=(Port("image", "image", (3, "H", "W")),),
        outputs=(Port("latent", "latent", _LATENT),),
        presets={"tiny": _VAE_TINY, "bagel-7b": _VAE_FLUX},
        num_params=_vae_encoder_params,
        args={**_WEIGHT_ARGS, **_VAE_ARGS},
    ),
    KindSpec(
        kind="vae_decoder",
        executor="vae_decoder",
        doc="FLUX VAE decoder: scaled, shifted 16-channel latent -> image (8x up)",
        inputs=(Port("latent", "latent", _LATENT),),
        outputs=(Port("image", "image", (3, "H", "W")),),
        presets={"tiny": _VAE_TINY, "bagel-7b": _VAE_FLUX},
        num_params=_vae_decoder_params,
        args={**_WEIGHT_ARGS, **_VAE_ARGS},
    ),
    KindSpec(
        kind="bagel_mot_lm",
        executor="bagel_mot_lm",
        doc="Qwen2.5 mixture-of-transformers LM: prefill text/ViT/VAE, decode text, predict velocity",
        inputs=(
            Port("tokens", "tokens", ("T",), optional=True),
            Port("embeds", "hidden", ("T", "hidden_size"), optional=True),
            Port("latent", "latent", _LATENT, optional=True),
            Port("timestep", "scalar", (), optional=True),
        ),
        outputs=(
            Port("velocity", "velocity", _LATENT),
            Port("token", "tokens", ("T",), stream=True),   # sampled tokens, one per decode step
        ),
        presets={"tiny": _LM_TINY, "bench-mid": _LM_BENCH_MID, "bagel-7b": _LM_BAGEL},
        num_params=_mot_lm_params,
        quant_linears=_mot_quant_linears,
        has_kv_cache=True,
        kv_bytes_per_token=_kv_bytes,
        tp_divides=("num_attention_heads", "num_key_value_heads"),
        args={**_WEIGHT_ARGS, "attention_backend": "auto"},
    ),
    KindSpec(
        kind="cfg_combine",
        executor="cfg_combine",
        doc="BAGEL CFG: combine full/text-dropped/image-dropped velocities, renorm, Euler step",
        inputs=(
            Port("v_full", "velocity", _LATENT),
            Port("v_text", "velocity", _LATENT, optional=True),
            Port("v_img", "velocity", _LATENT, optional=True),
            Port("latent", "latent", _LATENT),
            Port("timestep", "scalar", ()),
            Port("timestep_next", "scalar", ()),
        ),
        outputs=(Port("latent", "latent", _LATENT),),
        presets={"tiny": _CFG_DIMS, "bagel-7b": _CFG_DIMS},
        num_params=lambda d: 0,
        args={
            "text_scale": None,          # required (the graph binds it to $cfg_text_scale); <= 1 disables CFG
            "img_scale": None,           # required (the graph binds it to $cfg_img_scale); <= 1: no image branch
            "renorm_type": "global",     # "global" | "channel" | "text_channel"
            "renorm_min": 0.0,           # lower clamp of the renorm scale (upper is 1)
            "cfg_interval": [0.4, 1.0],  # CFG active where lo < t <= hi
        },
    ),
)


# the family, declared once: its kinds, and the runtime that implements them (runtime/models/bagel/)
FAMILY = Family(
    "bagel", KINDS,
    components={
        "bagel_mot_lm": "runtime.models.bagel.bagel_mot_lm:BagelMoTLM",
        "siglip_vit": "runtime.models.bagel.siglip_vit:SiglipVit",
        "vae_encoder": "runtime.models.bagel.vae_encoder:VaeEncoder",
        "vae_decoder": "runtime.models.bagel.vae_decoder:VaeDecoder",
        "cfg_combine": "runtime.models.bagel.cfg_combine:CfgCombine",
    },
    executors={
        "bagel_mot_lm": "runtime.models.bagel.executors:bagel_lm_executor",
        "bagel_image_encoder": "runtime.models.bagel.executors:image_encoder_executor",
        "vae_decoder": "runtime.models.bagel.executors:vae_decoder_executor",
        "cfg_combine": "runtime.models.bagel.executors:cfg_executor",
    },
    serving="runtime.models.bagel.serving:SERVING",
    kv_rows={"bagel_mot_lm": "runtime.models.bagel.row_keys:bagel_kv_rows"},
)
