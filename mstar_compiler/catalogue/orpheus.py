"""Orpheus TTS family: the audio side (`snac_decoder`). Torch-free.

Orpheus-3B's language model is the `llama_lm` kind (presets `orpheus-tiny`,
`orpheus-3b`, in `decoder_lm.py`); it emits audio tokens, 7 per SNAC frame. Those tokens
stream into `snac_decoder.codes` with the sliding chunk policy (window 28 = 4 frames,
stride 7 = 1 frame); each window is mapped to SNAC's three codebook levels (1 + 2 + 4
codes per frame), decoded with SNAC 24 kHz, and of the decoded 4-frame window the
samples of the second frame ([2048:4096] at 24 kHz) are kept, as Orpheus does.

The node holds SNAC's quantizer (codebooks and projections) and decoder only, not its
encoder: 13,152,242 parameters for the published 24 kHz model, whose full checkpoint
(with encoder) has 19,842,914.
"""
from __future__ import annotations

from mstar_compiler.catalogue import Dims, Family, KindSpec, Port


def _wn_conv(c_in: int, c_out: int, kernel: int, groups: int = 1, bias: bool = True) -> int:
    """Weight-normalised Conv1d: direction v, magnitude g (one per output channel), bias."""
    return c_out * (c_in // groups) * kernel + c_out + (c_out if bias else 0)


def _wn_conv_transpose(c_in: int, c_out: int, kernel: int) -> int:
    """Weight-normalised ConvTranspose1d: v, g (dim 0 = one per input channel), bias."""
    return c_in * c_out * kernel + c_in + c_out


def _residual_unit(dim: int) -> int:
    """Snake, depthwise conv k=7, Snake, pointwise conv (SNAC's ResidualUnit, depthwise)."""
    return dim + _wn_conv(dim, dim, 7, groups=dim) + dim + _wn_conv(dim, dim, 1)


def _quantizer_params(d: Dims) -> int:
    latent, cdim = d["latent_dim"], d["codebook_dim"]
    per_level = _wn_conv(latent, cdim, 1) + _wn_conv(cdim, latent, 1) + d["codebook_size"] * cdim
    return per_level * len(d["vq_strides"])


def _decoder_params(d: Dims) -> int:
    latent, channels = d["latent_dim"], d["decoder_dim"]
    total = _wn_conv(latent, latent, 7, groups=latent) + _wn_conv(latent, channels, 1)
    out_dim = channels
    for i, stride in enumerate(d["decoder_rates"]):
        in_dim, out_dim = channels // 2**i, channels // 2 ** (i + 1)
        total += in_dim + _wn_conv_transpose(in_dim, out_dim, 2 * stride)
        if d["noise"]:
            total += _wn_conv(out_dim, out_dim, 1, bias=False)
        total += 3 * _residual_unit(out_dim)
    return total + out_dim + _wn_conv(out_dim, 1, 7)


def snac_decoder_params(d: Dims) -> int:
    """Exact parameter count of the runtime `snac_decoder` module (quantizer + decoder)."""
    return _quantizer_params(d) + _decoder_params(d)


_SNAC_24KHZ = {
    "sampling_rate": 24000,
    "latent_dim": 768,            # encoder_dim 48 * 2**4
    "decoder_dim": 1024,
    "decoder_rates": (8, 8, 4, 2),
    "codebook_size": 4096,
    "codebook_dim": 8,
    "vq_strides": (4, 2, 1),      # coarse to fine: 1, 2, 4 codes per frame
    "noise": True,                # the published model has NoiseBlocks (weights exist)
    "tokens_per_frame": 7,
    "audio_token_offset": 128266,  # id of code 0 at frame position 0
}

SNAC_DECODER = KindSpec(
    kind="snac_decoder",
    executor="snac_decoder",
    doc="SNAC 24 kHz decoder for Orpheus audio tokens (7 per frame), sliding-window decode",
    inputs=(Port("codes", "tokens", ("T",), stream=True),),
    outputs=(Port("audio", "audio", ("S",)),),
    presets={
        # Same structure, rates and token contract as 24khz (2048 samples per frame,
        # 3 levels, 4096 codes, offset 128266) with narrow channels.
        "tiny": {**_SNAC_24KHZ, "latent_dim": 16, "decoder_dim": 32},
        "24khz": dict(_SNAC_24KHZ),
    },
    num_params=snac_decoder_params,
    has_kv_cache=False,
    can_batch=True,
    is_capture_safe=True,  # steady-state windows are always 28 tokens (static shapes); flush windows run eagerly
    args={
        # SNAC's decoder adds learned-scale Gaussian noise after each upsampling (as
        # published). Off by default: a deterministic, batch-invariant decode.
        "noise": False,
        # emit frame 0 and the two lagged tail frames too (True), or exactly Orpheus's
        # [2048:4096] per window and nothing else (False); see runtime/models/orpheus/windows.py
        "keep_edges": True,
    },
)

KINDS: tuple[KindSpec, ...] = (SNAC_DECODER,)


# the family, declared once: its kinds, and the runtime that implements them (runtime/models/orpheus/)
FAMILY = Family(
    "orpheus", KINDS,
    components={
        "snac_decoder": "runtime.models.orpheus.snac_decoder:SnacDecoder",
    },
    executors={
        "orpheus_lm": "runtime.models.orpheus.executors:orpheus_lm_executor",
        "snac_decoder": "runtime.models.orpheus.executors:snac_executor",
    },
    serving="runtime.models.orpheus.serving:SERVING",
)
