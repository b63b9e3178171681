"""transformers' Qwen3-Omni-MoE configs built from mstar's catalogue presets: one network, described twice.

Each `<part>_config(dims)` turns a catalogue preset of one node kind into the transformers config that
describes the same network. The parity tests build the reference modules from them (tiny presets, eager
attention: the reference arithmetic; tests/runtime/models/qwen3_omni/omni_reference.py) and the `omni-wide`
suite writes the published repository's config.json from them (bench.omni_wide_weights).
"""
from __future__ import annotations

from typing import Any, Mapping

from transformers.models.qwen3_omni_moe import configuration_qwen3_omni_moe as hf_config

Dims = Mapping[str, Any]
EAGER = "eager"


def _attention(config: Any, attn: str) -> Any:
    config._attn_implementation = attn
    return config


def code2wav_config(d: Dims, attn: str = EAGER) -> Any:
    keys = ("codebook_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
            "num_hidden_layers", "num_quantizers", "sliding_window", "rms_norm_eps", "layer_scale_initial_scale",
            "decoder_dim")
    return _attention(hf_config.Qwen3OmniMoeCode2WavConfig(
        **{k: d[k] for k in keys}, upsample_rates=list(d["upsample_rates"]),
        upsampling_ratios=list(d["upsampling_ratios"]),
        rope_parameters={"rope_type": "default", "rope_theta": d["rope_theta"]},
    ), attn)


def talker_config(t: Dims, p: Dims, attn: str = EAGER) -> Any:
    """Qwen3OmniMoeTalkerConfig for talker preset `t` and code predictor preset `p`."""
    text_keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "vocab_size", "num_experts", "num_experts_per_tok",
                 "moe_intermediate_size", "shared_expert_intermediate_size", "norm_topk_prob", "rms_norm_eps")
    text = {k: t[k] for k in text_keys}
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": t["rope_theta"],
                               "mrope_section": list(t["mrope_section"]), "interleaved": True}
    codec_keys = ("codec_eos_token_id", "codec_nothink_id", "codec_think_bos_id", "codec_think_eos_id",
                  "codec_pad_id", "codec_bos_id", "accept_hidden_layer")
    config = hf_config.Qwen3OmniMoeTalkerConfig(
        text_config=text, code_predictor_config=predictor_config(p, attn), num_code_groups=t["num_code_groups"],
        thinker_hidden_size=t["thinker_hidden_size"], spatial_merge_size=2, speaker_id=dict(t["speaker_id"]),
        **{k: t[k] for k in codec_keys})
    for sub in (config, config.text_config, config.code_predictor_config):
        _attention(sub, attn)
    return config


def predictor_config(p: Dims, attn: str = EAGER) -> Any:
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "vocab_size", "num_code_groups", "rms_norm_eps")
    return _attention(hf_config.Qwen3OmniMoeTalkerCodePredictorConfig(
        **{k: p[k] for k in keys}, rope_parameters={"rope_type": "default", "rope_theta": p["rope_theta"]}), attn)


def audio_config(d: Dims, attn: str = EAGER) -> Any:
    keys = ("num_mel_bins", "d_model", "encoder_layers", "encoder_attention_heads", "encoder_ffn_dim",
            "downsample_hidden_size", "output_dim", "max_source_positions", "n_window", "n_window_infer")
    return _attention(hf_config.Qwen3OmniMoeAudioEncoderConfig(**{k: d[k] for k in keys}), attn)


def vision_config(d: Dims, attn: str = EAGER) -> Any:
    keys = ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "patch_size",
            "temporal_patch_size", "spatial_merge_size", "out_hidden_size", "num_position_embeddings")
    return _attention(hf_config.Qwen3OmniMoeVisionEncoderConfig(
        **{k: d[k] for k in keys}, deepstack_visual_indexes=list(d["deepstack_visual_indexes"]),
        rope_parameters={"rope_type": "axial", "rope_theta": d["rope_theta"]}), attn)


def omni_config(thinker: Dims, talker: Dims, predictor: Dims, code2wav: Dims, audio: Dims, vision: Dims,
                attn: str = EAGER) -> Any:
    """The whole Qwen3-Omni (thinker with its encoders, talker, code2wav); `thinker` is a qwen3_moe_lm preset,
    whose rotary sections are the talker's where the preset names none."""
    text_keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                 "rms_norm_eps")
    text = {k: thinker[k] for k in text_keys}
    sections = (thinker.get("rope_scaling") or {}).get("mrope_section", talker["mrope_section"])
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": thinker["rope_theta"],
                               "mrope_section": list(sections), "interleaved": True}
    ids = {k: talker[k] for k in ("audio_token_id", "image_token_id", "video_token_id", "vision_start_token_id",
                                  "audio_start_token_id")}
    config = hf_config.Qwen3OmniMoeConfig(
        thinker_config=dict(text_config=text, audio_config=audio_config(audio, attn),
                            vision_config=vision_config(vision, attn),
                            position_id_per_seconds=vision["position_id_per_seconds"], **ids),
        talker_config=talker_config(talker, predictor, attn),
        code2wav_config=code2wav_config(code2wav, attn),
        **{k: talker[k] for k in ("im_start_token_id", "user_token_id", "assistant_token_id",
                                  "tts_pad_token_id", "tts_bos_token_id", "tts_eos_token_id")})
    for sub in (config, config.thinker_config, config.thinker_config.text_config):
        _attention(sub, attn)
    return config
