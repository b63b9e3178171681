"""transformers' Qwen3-Omni-MoE classes built from our presets: the same-weights parity oracles.

Each `<part>_config(dims)` turns one of our catalogue presets into the transformers config
that describes the same network, so a test can build both, load the reference's weights
into ours through the published checkpoint layout (`checkpoint_tensors`) and compare
outputs. Configs use eager attention (the reference arithmetic) in fp32.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from transformers.models.qwen3_omni_moe import configuration_qwen3_omni_moe as hf_config
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf_model

from mstar_compiler.catalogue import load_catalogue

Dims = Mapping[str, Any]


# |a - b| against the largest |b|: fp32 against transformers' module on the same weights, the same layers in other op
# orders (fused projections, packed or varlen attention), a few ulps (eps 1.2e-7) of the largest value per layer:
# 1e-4 is ~800 of them. Measured at most 1.0e-6 of the largest value (code2wav's deep stack of convolutions,
# upsampling and a transformer; 1.6e-7 to 2.7e-7 for the talker and the audio and vision encoders; 7.8e-7 over the
# published-layout parts of tests/runtime/weights/test_published_omni.py)
CLOSE_RTOL = 1e-4


def close_to_largest(a: torch.Tensor, b: torch.Tensor, rtol: float = CLOSE_RTOL) -> bool:
    """Whether `a` equals `b` within `rtol` of b's largest magnitude (a model's small outputs carry the rounding of
    its large ones, so an element-wise relative bound would ask too much of them)."""
    return bool((a - b).abs().max() <= rtol * b.abs().max())


def preset(kind: str, name: str = "tiny") -> dict[str, Any]:
    return dict(load_catalogue()[kind].presets[name])


def _eager(config: Any) -> Any:
    config._attn_implementation = "eager"
    return config


def code2wav_config(d: Dims) -> Any:
    keys = ("codebook_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
            "num_hidden_layers", "num_quantizers", "sliding_window", "rms_norm_eps", "layer_scale_initial_scale",
            "decoder_dim")
    return _eager(hf_config.Qwen3OmniMoeCode2WavConfig(
        **{k: d[k] for k in keys}, upsample_rates=list(d["upsample_rates"]),
        upsampling_ratios=list(d["upsampling_ratios"]),
        rope_parameters={"rope_type": "default", "rope_theta": d["rope_theta"]},
    ))


def randomize(module: torch.nn.Module, seed: int = 0) -> None:
    """Seeded random values for every parameter, so that no layer is an identity at init
    (transformers initialises layer scales, snake exponents and norm weights to constants)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            noise = torch.randn(p.shape, generator=generator)
            if p.ndim > 1:
                p.copy_(0.5 * noise / p[0].numel() ** 0.5)
            elif name.endswith(("alpha", "beta", "bias")):
                p.copy_(0.3 * noise)
            else:  # norm weights, layer scales, ConvNeXt gammas
                p.copy_(1.0 + 0.2 * noise)


def talker_config(t: Dims, p: Dims) -> Any:
    """Qwen3OmniMoeTalkerConfig for our talker preset `t` and code predictor preset `p`."""
    text_keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "vocab_size", "num_experts", "num_experts_per_tok",
                 "moe_intermediate_size", "shared_expert_intermediate_size", "norm_topk_prob", "rms_norm_eps")
    text = {k: t[k] for k in text_keys}
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": t["rope_theta"],
                               "mrope_section": list(t["mrope_section"]), "interleaved": True}
    codec_keys = ("codec_eos_token_id", "codec_nothink_id", "codec_think_bos_id", "codec_think_eos_id",
                  "codec_pad_id", "codec_bos_id", "accept_hidden_layer")
    config = hf_config.Qwen3OmniMoeTalkerConfig(
        text_config=text, code_predictor_config=predictor_config(p), num_code_groups=t["num_code_groups"],
        thinker_hidden_size=t["thinker_hidden_size"], spatial_merge_size=2, speaker_id=dict(t["speaker_id"]),
        **{k: t[k] for k in codec_keys})
    for sub in (config, config.text_config, config.code_predictor_config):
        _eager(sub)
    return config


def predictor_config(p: Dims) -> Any:
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "vocab_size", "num_code_groups", "rms_norm_eps")
    return _eager(hf_config.Qwen3OmniMoeTalkerCodePredictorConfig(
        **{k: p[k] for k in keys}, rope_parameters={"rope_type": "default", "rope_theta": p["rope_theta"]}))


def checkpoint_tensors(module: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """`module`'s parameters in the published checkpoint's layout: transformers 5 stacks MoE
    experts (experts.gate_up_proj, experts.down_proj); the checkpoint keeps one tensor per
    expert (experts.{e}.gate_proj.weight, ...). Only names under `prefix`, prefix stripped."""
    tensors: dict[str, torch.Tensor] = {}
    for name, value in module.state_dict().items():
        if not name.startswith(prefix) or name in _buffers(module):
            continue
        name = name[len(prefix):]
        if name.endswith("experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            for e, fused in enumerate(value):
                gate, up = fused.chunk(2, dim=0)
                tensors[f"{base}{e}.gate_proj.weight"], tensors[f"{base}{e}.up_proj.weight"] = gate, up
        elif name.endswith("experts.down_proj"):
            base = name[: -len("down_proj")]
            tensors.update({f"{base}{e}.down_proj.weight": w for e, w in enumerate(value)})
        else:
            tensors[name] = value
    return tensors


def _buffers(module: torch.nn.Module) -> set[str]:
    return {name for name, _ in module.named_buffers()}


def audio_config(d: Dims) -> Any:
    keys = ("num_mel_bins", "d_model", "encoder_layers", "encoder_attention_heads", "encoder_ffn_dim",
            "downsample_hidden_size", "output_dim", "max_source_positions", "n_window", "n_window_infer")
    return _eager(hf_config.Qwen3OmniMoeAudioEncoderConfig(**{k: d[k] for k in keys}))


def vision_config(d: Dims) -> Any:
    keys = ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "patch_size",
            "temporal_patch_size", "spatial_merge_size", "out_hidden_size", "num_position_embeddings")
    return _eager(hf_config.Qwen3OmniMoeVisionEncoderConfig(
        **{k: d[k] for k in keys}, deepstack_visual_indexes=list(d["deepstack_visual_indexes"]),
        rope_parameters={"rope_type": "axial", "rope_theta": d["rope_theta"]}))


def omni_config(thinker: Dims) -> Any:
    """The whole Qwen3-Omni (thinker, talker, code2wav) at tiny size; `thinker` is a qwen3_moe_lm preset."""
    talker = preset("qwen3_omni_talker")
    text_keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                 "rms_norm_eps")
    text = {k: thinker[k] for k in text_keys}
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": thinker["rope_theta"],
                               "mrope_section": [4, 2, 2], "interleaved": True}
    ids = {k: talker[k] for k in ("audio_token_id", "image_token_id", "video_token_id", "vision_start_token_id",
                                  "audio_start_token_id")}
    vision = preset("qwen3_omni_vision_encoder")
    config = hf_config.Qwen3OmniMoeConfig(
        thinker_config=dict(text_config=text, audio_config=audio_config(preset("qwen3_omni_audio_encoder")),
                            vision_config=vision_config(vision),
                            position_id_per_seconds=vision["position_id_per_seconds"], **ids),
        talker_config=talker_config(talker, preset("qwen3_omni_code_predictor")),
        code2wav_config=code2wav_config(preset("qwen3_omni_code2wav")),
        **{k: talker[k] for k in ("im_start_token_id", "user_token_id", "assistant_token_id",
                                  "tts_pad_token_id", "tts_bos_token_id", "tts_eos_token_id")})
    for sub in (config, config.thinker_config, config.thinker_config.text_config):
        _eager(sub)
    return config


__all__ = ["hf_config", "hf_model", "preset", "randomize", "checkpoint_tensors", "code2wav_config", "thinker_reference",
           "talker_config", "predictor_config", "audio_config", "vision_config", "omni_config"]


def thinker_reference(thinker: torch.nn.Module, audio: torch.nn.Module, seed: int = 0,
                      vision: torch.nn.Module | None = None) -> Any:
    """transformers' Qwen3-Omni thinker holding the seeded random weights our `thinker`, `audio` (and
    `vision`) modules (and so a served tiny plan) were built with: the same tensors, regenerated by name."""
    from runtime.model_executor.weights import random_tensors

    reference = hf_model.Qwen3OmniMoeThinkerForConditionalGeneration(
        omni_config(preset("qwen3_moe_lm")).thinker_config).eval()
    state: dict[str, torch.Tensor] = {}
    for name, tensor in random_tensors(thinker.hf_slots(), seed):
        state[name if name == "lm_head.weight" else f"model.language_model.{name[len('model.'):]}"] = tensor
    state.update({f"model.audio_tower.{k}": v for k, v in random_tensors(audio.hf_slots(), seed)})
    if vision is not None:
        state.update({f"model.visual.{k}": v for k, v in random_tensors(vision.hf_slots(), seed)})
    missing = reference.load_state_dict(_stack_experts(state), strict=False).missing_keys
    assert all(k.startswith("model.visual.") and vision is None for k in missing), missing
    return reference


def _stack_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert checkpoint tensors -> transformers 5's stacked `experts.gate_up_proj` / `down_proj`."""
    out, experts = {}, {}
    for name, value in state.items():
        if ".mlp.experts." not in name:
            out[name] = value
            continue
        base, rest = name.split(".mlp.experts.")
        e, proj = rest.split(".")[:2]
        experts.setdefault(base, {}).setdefault(int(e), {})[proj] = value
    for base, by_expert in experts.items():
        order = sorted(by_expert)
        out[f"{base}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([by_expert[e]["gate_proj"], by_expert[e]["up_proj"]]) for e in order])
        out[f"{base}.mlp.experts.down_proj"] = torch.stack([by_expert[e]["down_proj"] for e in order])
    return out


def randomized_thinker(thinker: torch.nn.Module, audio: torch.nn.Module, seed: int = 13,
                       vision: torch.nn.Module | None = None) -> Any:
    """transformers' Qwen3-Omni thinker with `randomize`d weights (strong enough that every input
    row moves the logits), loaded into our `thinker`, `audio` (and `vision`) modules through the
    checkpoint layout."""
    reference = hf_model.Qwen3OmniMoeThinkerForConditionalGeneration(
        omni_config(preset("qwen3_moe_lm")).thinker_config).eval()
    randomize(reference, seed)
    tensors = checkpoint_tensors(reference)
    text = {("model." + k[len("model.language_model."):] if k.startswith("model.language_model.") else k): v
            for k, v in tensors.items() if k.startswith(("model.language_model.", "lm_head."))}
    thinker.load_hf_state_dict(text)
    audio.load_hf_state_dict({k[len("model.audio_tower."):]: v for k, v in tensors.items()
                              if k.startswith("model.audio_tower.")})
    if vision is not None:
        vision.load_hf_state_dict({k[len("model.visual."):]: v for k, v in tensors.items()
                                   if k.startswith("model.visual.")})
    return reference
