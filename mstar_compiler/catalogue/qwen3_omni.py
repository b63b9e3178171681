"""Catalogue entries of Qwen3-Omni's own components (the thinker is `qwen3_moe_lm`).

Five kinds, each implemented in `runtime/model_executor/components/<kind>.py`:

  qwen3_omni_audio_encoder   16 kHz waveform -> log-mel -> AuT encoder -> thinker-width hidden states
  qwen3_omni_vision_encoder  image -> patches -> ViT (+ DeepStack taps) -> thinker-width hidden states
  qwen3_omni_talker          MoE LM reading the thinker's hidden states, emitting codebook 0 of each frame
  qwen3_omni_code_predictor  dense LM predicting codebooks 1..G-1 of a frame from the talker's hidden
  qwen3_omni_code2wav        causal codec decoder: frames of G codes -> 24 kHz audio (1920 samples a frame)

The full-size preset `qwen3-omni-30b-a3b` carries the dimensions of the published checkpoint
Qwen/Qwen3-Omni-30B-A3B-Instruct (its config.json). Where transformers' `Qwen3OmniMoe*Config`
class defaults disagree with that checkpoint the checkpoint wins, because real weights must
load and connected ports must agree: audio `output_dim` and vision `out_hidden_size` are 2048
(class default 3584), `num_code_groups` is 16 (class default 32, which would not match
code2wav's 16 quantizers), the talker has `head_dim` 128, 6 experts per token, normalised top-k
weights and a 768-wide shared expert (the class has no default for it), and codec special ids
sit at 2148..2157 (class defaults 4196..4205).

Torch-free: `num_params` counts are closed-form and equal `sum(p.numel())` of the runtime
modules (tests/runtime/models/test_registry_matches_catalogue.py builds the tiny presets;
tests/runtime/qwen3_omni/test_catalogue.py checks the full-size counts against transformers'
modules built on the meta device).
"""
from __future__ import annotations

from typing import Any, Mapping

from mstar_compiler.catalogue import Dims, Family, KindSpec, Linear, Port
from mstar_compiler.catalogue.decoder_lm import attention_linears, swiglu_linears

FULL = "qwen3-omni-30b-a3b"

# ---------------------------------------------------------------- shared counting helpers


def _linear(n_in: int, n_out: int, bias: bool) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _conv1d(c_in: int, c_out: int, kernel: int, groups: int = 1) -> int:
    return c_out * (c_in // groups) * kernel + c_out


def _qk_norm_attention(d: Dims) -> int:
    """q/k/v/o projections without bias plus per-head q_norm and k_norm (Qwen3 attention)."""
    h, hd = d["hidden_size"], d["head_dim"]
    q, kv = d["num_attention_heads"] * hd, d["num_key_value_heads"] * hd
    return 2 * h * q + 2 * h * kv + 2 * hd


def _kv_bytes(d: Dims, dtype_bytes: int) -> int:
    return d["num_hidden_layers"] * 2 * d["num_key_value_heads"] * d["head_dim"] * dtype_bytes


# ---------------------------------------------------------------- audio encoder

_AUDIO_TINY: dict[str, Any] = {
    "num_mel_bins": 32, "d_model": 32, "encoder_layers": 2, "encoder_attention_heads": 4,
    "encoder_ffn_dim": 64, "downsample_hidden_size": 16, "output_dim": 64,
    "max_source_positions": 1500, "n_window": 50, "n_window_infer": 200, "sampling_rate": 16000,
}
_AUDIO_FULL: dict[str, Any] = {
    "num_mel_bins": 128, "d_model": 1280, "encoder_layers": 32, "encoder_attention_heads": 20,
    "encoder_ffn_dim": 5120, "downsample_hidden_size": 480, "output_dim": 2048,
    "max_source_positions": 1500, "n_window": 50, "n_window_infer": 800, "sampling_rate": 16000,
}


def _conv_out_width(num_mel_bins: int) -> int:
    """Mel bins left after three stride-2 convolutions (padding 1, kernel 3)."""
    width = num_mel_bins
    for _ in range(3):
        width = (width + 1) // 2
    return width


def audio_encoder_params(d: Dims) -> int:
    e, c = d["d_model"], d["downsample_hidden_size"]
    layer = 4 * _linear(e, e, True) + 2 * 2 * e + _linear(e, d["encoder_ffn_dim"], True) \
        + _linear(d["encoder_ffn_dim"], e, True)
    convs = (c * 9 + c) + 2 * (c * c * 9 + c)
    head = _linear(c * _conv_out_width(d["num_mel_bins"]), e, False) + 2 * e \
        + _linear(e, e, True) + _linear(e, d["output_dim"], True)
    return d["encoder_layers"] * layer + convs + head


# ---------------------------------------------------------------- vision encoder

_VISION_TINY: dict[str, Any] = {
    "depth": 3, "hidden_size": 32, "intermediate_size": 64, "num_heads": 4, "in_channels": 3,
    "patch_size": 8, "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 64,
    "num_position_embeddings": 64, "deepstack_visual_indexes": (0, 1), "rope_theta": 10000.0,
    # the processor's (runtime/models/qwen3_omni/vision_inputs.py): resized pixel bounds (images, video
    # frames), M-RoPE time scale
    "min_pixels": 256, "max_pixels": 4096, "video_min_pixels": 256, "video_max_pixels": 4096,
    "position_id_per_seconds": 13,
}
_VISION_FULL: dict[str, Any] = {
    "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "in_channels": 3,
    "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 2048,
    "num_position_embeddings": 2304, "deepstack_visual_indexes": (8, 16, 24), "rope_theta": 10000.0,
    "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280, "position_id_per_seconds": 13,
    # Qwen3OmniMoeProcessor's videos_kwargs size: shortest_edge / longest_edge per frame
    "video_min_pixels": 128 * 32 * 32, "video_max_pixels": 768 * 32 * 32,
}


def _merger_params(d: Dims, postshuffle_norm: bool) -> int:
    wide = d["hidden_size"] * d["spatial_merge_size"] ** 2
    norm = 2 * (wide if postshuffle_norm else d["hidden_size"])
    return norm + _linear(wide, wide, True) + _linear(wide, d["out_hidden_size"], True)


def vision_encoder_params(d: Dims) -> int:
    h, i = d["hidden_size"], d["intermediate_size"]
    block = 2 * 2 * h + _linear(h, 3 * h, True) + _linear(h, h, True) + _linear(h, i, True) + _linear(i, h, True)
    patch = d["in_channels"] * d["temporal_patch_size"] * d["patch_size"] ** 2 * h + h
    mergers = _merger_params(d, False) + len(d["deepstack_visual_indexes"]) * _merger_params(d, True)
    return d["depth"] * block + patch + d["num_position_embeddings"] * h + mergers


# ---------------------------------------------------------------- talker

_TALKER_TINY: dict[str, Any] = {
    "thinker_hidden_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 96,
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 32, "norm_topk_prob": True, "rms_norm_eps": 1e-6,
    "rope_theta": 1e6, "mrope_section": (4, 2, 2), "num_code_groups": 4, "accept_hidden_layer": 1,
    "codec_pad_id": 64, "codec_bos_id": 65, "codec_eos_token_id": 66, "codec_nothink_id": 67,
    "codec_think_bos_id": 68, "codec_think_eos_id": 69, "codebook_size": 64,
    "speaker_id": {"chelsie": 70, "ethan": 71, "aiden": 72},
    # thinker-vocabulary ids the talker's prompt is cut and padded with, and the chat processor's
    # audio/vision markers (runtime/models/qwen3_omni/chat_inputs.py; tiny thinker vocab: 512)
    "im_start_token_id": 500, "user_token_id": 501, "assistant_token_id": 502,
    "audio_token_id": 503, "image_token_id": 504, "video_token_id": 505,
    "audio_start_token_id": 496, "audio_end_token_id": 497, "vision_start_token_id": 499, "vision_end_token_id": 498,
    "tts_pad_token_id": 506, "tts_bos_token_id": 507, "tts_eos_token_id": 508,
}
_TALKER_FULL: dict[str, Any] = {
    "thinker_hidden_size": 2048, "hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": 20,
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 3072,
    "num_experts": 128, "num_experts_per_tok": 6, "moe_intermediate_size": 384,
    "shared_expert_intermediate_size": 768, "norm_topk_prob": True, "rms_norm_eps": 1e-6,
    "rope_theta": 1e6, "mrope_section": (24, 20, 20), "num_code_groups": 16, "accept_hidden_layer": 24,
    "codec_pad_id": 2148, "codec_bos_id": 2149, "codec_eos_token_id": 2150, "codec_nothink_id": 2155,
    "codec_think_bos_id": 2156, "codec_think_eos_id": 2157, "codebook_size": 2048,
    "speaker_id": {"chelsie": 2301, "ethan": 2302, "aiden": 2303},
    "im_start_token_id": 151644, "user_token_id": 872, "assistant_token_id": 77091,
    "audio_token_id": 151675, "image_token_id": 151655, "video_token_id": 151656,
    "audio_start_token_id": 151669, "audio_end_token_id": 151670, "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "tts_pad_token_id": 151671, "tts_bos_token_id": 151672, "tts_eos_token_id": 151673,
}


def _swiglu(h: int, i: int) -> int:
    return 3 * h * i


def talker_params(d: Dims) -> int:
    h, e = d["hidden_size"], d["num_experts"]
    moe = e * h + e * _swiglu(h, d["moe_intermediate_size"]) \
        + _swiglu(h, d["shared_expert_intermediate_size"]) + h
    layer = _qk_norm_attention(d) + moe + 2 * h
    projection = _linear(d["thinker_hidden_size"], d["intermediate_size"], True) \
        + _linear(d["intermediate_size"], h, True)
    return d["num_hidden_layers"] * layer + h + 2 * d["vocab_size"] * h + 2 * projection


def talker_quant_linears(d: Dims) -> list[Linear]:
    """Every layer's attention, routed experts and shared expert (mstar_compiler.quant)."""
    h = d["hidden_size"]
    layer = attention_linears(d) + swiglu_linears(h, d["moe_intermediate_size"], d["num_experts"]) \
        + swiglu_linears(h, d["shared_expert_intermediate_size"])
    return [Linear(lin.n, lin.k, lin.count * d["num_hidden_layers"], lin.splits_input) for lin in layer]


# ---------------------------------------------------------------- code predictor

_PREDICTOR_TINY: dict[str, Any] = {
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 64, "num_code_groups": 4,
    "rms_norm_eps": 1e-6, "rope_theta": 1e6,
}
_PREDICTOR_FULL: dict[str, Any] = {
    "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 5, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 2048, "num_code_groups": 16,
    "rms_norm_eps": 1e-6, "rope_theta": 1e6,
}


def code_predictor_params(d: Dims) -> int:
    h = d["hidden_size"]
    layer = _qk_norm_attention(d) + _swiglu(h, d["intermediate_size"]) + 2 * h
    per_group = 2 * d["vocab_size"] * h  # one codec embedding and one lm head per residual codebook
    return d["num_hidden_layers"] * layer + h + (d["num_code_groups"] - 1) * per_group


# ---------------------------------------------------------------- code2wav

_CODE2WAV_TINY: dict[str, Any] = {
    "codebook_size": 64, "num_quantizers": 4, "hidden_size": 32, "num_attention_heads": 4,
    "num_key_value_heads": 4, "intermediate_size": 64, "num_hidden_layers": 2, "sliding_window": 4,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "layer_scale_initial_scale": 0.01,
    "upsampling_ratios": (2, 2), "upsample_rates": (8, 5, 4, 3), "decoder_dim": 32,
    "sampling_rate": 24000,
}
_CODE2WAV_FULL: dict[str, Any] = {
    "codebook_size": 2048, "num_quantizers": 16, "hidden_size": 1024, "num_attention_heads": 16,
    "num_key_value_heads": 16, "intermediate_size": 3072, "num_hidden_layers": 8, "sliding_window": 72,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "layer_scale_initial_scale": 0.01,
    "upsampling_ratios": (2, 2), "upsample_rates": (8, 5, 4, 3), "decoder_dim": 1536,
    "sampling_rate": 24000,
}


def _residual_unit(c: int) -> int:
    return 2 * c + _conv1d(c, c, 7) + 2 * c + _conv1d(c, c, 1)


def code2wav_params(d: Dims) -> int:
    h = d["hidden_size"]
    attn = 2 * h * d["num_attention_heads"] * (h // d["num_attention_heads"]) \
        + 2 * h * d["num_key_value_heads"] * (h // d["num_attention_heads"])
    layer = attn + _swiglu(h, d["intermediate_size"]) + 4 * h
    transformer = d["num_hidden_layers"] * layer + h
    convnext = _conv1d(h, h, 7, groups=h) + 2 * h + _linear(h, 4 * h, True) + _linear(4 * h, h, True) + h
    upsample = sum(h * h * r + h + convnext for r in d["upsampling_ratios"])
    decoder = _conv1d(h, d["decoder_dim"], 7)
    for i, rate in enumerate(d["upsample_rates"]):
        c_in, c_out = d["decoder_dim"] >> i, d["decoder_dim"] >> (i + 1)
        decoder += 2 * c_in + c_in * c_out * 2 * rate + c_out + 3 * _residual_unit(c_out)
    c_last = d["decoder_dim"] >> len(d["upsample_rates"])
    decoder += 2 * c_last + _conv1d(c_last, 1, 7)
    embedding = d["codebook_size"] * d["num_quantizers"] * h
    return embedding + transformer + upsample + decoder


# ---------------------------------------------------------------- the kinds


def _presets(tiny: Mapping[str, Any], full: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {"tiny": dict(tiny), FULL: dict(full)}


# YAML `args:` of every kind here (the decoder LMs take the same)
ARGS: dict[str, Any] = {
    "weights": None,  # the whole model's safetensors checkpoint (file or dir); None: seeded random weights
    "seed": 0,        # seed of the random weights when `weights` is None
}
LM_ARGS: dict[str, Any] = {**ARGS, "attention_backend": "auto"}  # torch | triton | flashinfer | auto


KINDS: tuple[KindSpec, ...] = (
    KindSpec(
        kind="qwen3_omni_audio_encoder",
        layer_dim="encoder_layers",
        executor="qwen3_omni_audio_encoder",
        doc="Qwen3-Omni AuT audio encoder: 16 kHz waveform -> log-mel -> hidden states at 12.5 Hz",
        # `mel`: a live utterance's log-mel frames, one item each, encoded per attention window
        inputs=(Port("audio", "audio", ("S",)),
                Port("mel", "audio", ("num_mel_bins",), stream=True, optional=True, chunk="n_window_infer")),
        outputs=(Port("hidden", "hidden", ("T", "output_dim")),),
        presets=_presets(_AUDIO_TINY, _AUDIO_FULL),
        num_params=audio_encoder_params,
        tp_divides=("encoder_attention_heads",),
        args=ARGS,
    ),
    KindSpec(
        kind="qwen3_omni_vision_encoder",
        layer_dim="depth",
        executor="qwen3_omni_vision_encoder",
        doc="Qwen3-Omni vision encoder: image -> merged patch hidden states plus DeepStack taps",
        inputs=(Port("image", "image", (3, "H", "W")),),
        outputs=(
            Port("hidden", "hidden", ("T", "out_hidden_size")),
            Port("deepstack", "hidden", ("D", "T", "out_hidden_size")),
        ),
        presets=_presets(_VISION_TINY, _VISION_FULL),
        num_params=vision_encoder_params,
        tp_divides=("num_heads",),
        args=ARGS,
    ),
    KindSpec(
        kind="qwen3_omni_talker",
        executor="qwen3_omni_talker",
        first_run_chunks=2,   # its prompt: the thinker's prompt rows, then its first token
        doc="Qwen3-Omni talker: MoE LM over projected thinker states, emits codebook 0 of each codec frame",
        inputs=(
            Port("thinker_hidden", "hidden", ("T", "thinker_hidden_size"), stream=True),
            Port("thinker_mm_hidden", "hidden", ("T", "thinker_hidden_size"), optional=True),
            Port("frame_embed", "hidden", ("F", "hidden_size"), stream=True, optional=True),
        ),
        outputs=(
            Port("code0", "codes", ("F",), stream=True),
            Port("hidden", "hidden", ("F", 2, "hidden_size"), stream=True),
        ),
        presets=_presets(_TALKER_TINY, _TALKER_FULL),
        num_params=talker_params,
        quant_linears=talker_quant_linears,
        has_kv_cache=True,
        is_capture_safe=True,
        kv_bytes_per_token=_kv_bytes,
        tp_divides=("num_attention_heads", "num_key_value_heads"),
        args={**LM_ARGS, "speaker": "ethan"},  # the voice when a request names none
    ),
    KindSpec(
        kind="qwen3_omni_code_predictor",
        executor="qwen3_omni_code_predictor",
        doc="Qwen3-Omni multi-token code predictor: talker hidden + codebook 0 -> the frame's other codebooks",
        inputs=(
            Port("hidden", "hidden", ("F", 2, "hidden_size"), stream=True),
            Port("code0", "codes", ("F",), stream=True),
        ),
        outputs=(
            Port("frame", "codes", ("F", "num_code_groups"), stream=True),
            Port("frame_embed", "hidden", ("F", "hidden_size"), stream=True),
        ),
        presets=_presets(_PREDICTOR_TINY, _PREDICTOR_FULL),
        num_params=code_predictor_params,
        has_kv_cache=True,  # per frame: one block of num_code_groups rows per request
        kv_bytes_per_token=_kv_bytes,
        tp_divides=("num_attention_heads", "num_key_value_heads"),
        args=LM_ARGS,
    ),
    KindSpec(
        kind="qwen3_omni_code2wav",
        executor="qwen3_omni_code2wav",
        doc="Qwen3-Omni code2wav: causal codec decoder, frames of codes -> 24 kHz audio",
        inputs=(Port("codes", "codes", ("F", "num_quantizers"), stream=True),),
        outputs=(Port("audio", "audio", ("S",), stream=True),),
        presets=_presets(_CODE2WAV_TINY, _CODE2WAV_FULL),
        num_params=code2wav_params,
        args=ARGS,
    ),
)


# the family, declared once: its kinds, and the runtime that implements them (runtime/models/qwen3_omni/)
FAMILY = Family(
    "qwen3_omni", KINDS,
    components={
        "qwen3_omni_audio_encoder": "runtime.models.qwen3_omni.qwen3_omni_audio_encoder:Qwen3OmniAudioEncoder",
        "qwen3_omni_vision_encoder": "runtime.models.qwen3_omni.qwen3_omni_vision_encoder:Qwen3OmniVisionEncoder",
        "qwen3_omni_talker": "runtime.models.qwen3_omni.qwen3_omni_talker:Qwen3OmniTalker",
        "qwen3_omni_code_predictor": "runtime.models.qwen3_omni.qwen3_omni_code_predictor:Qwen3OmniCodePredictor",
        "qwen3_omni_code2wav": "runtime.models.qwen3_omni.qwen3_omni_code2wav:Qwen3OmniCode2Wav",
    },
    executors={
        "qwen3_omni_thinker": "runtime.models.qwen3_omni.executors:thinker_executor",
        "qwen3_omni_vision_encoder": "runtime.models.qwen3_omni.executors:vision_encoder_executor",
        "qwen3_omni_audio_encoder": "runtime.models.qwen3_omni.executors:audio_encoder_executor",
        "qwen3_omni_talker": "runtime.models.qwen3_omni.executors:talker_executor",
        "qwen3_omni_code_predictor": "runtime.models.qwen3_omni.executors:code_predictor_executor",
        "qwen3_omni_code2wav": "runtime.models.qwen3_omni.executors:code2wav_executor",
    },
    serving="runtime.models.qwen3_omni.serving:SERVING",
    kv_rows={"qwen3_omni_talker": "runtime.models.qwen3_omni.executors:talker_kv_rows"},
)
