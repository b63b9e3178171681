"""BAGEL-7B-MoT's published repository layout, written and read outside mstar: the configs BAGEL's loader
reads, `ae.safetensors` in the original FLUX autoencoder layout, and diffusers' AutoencoderKL filled from it.

Shared by the tests that serve tiny checkpoints in this layout and by the `bagel-wide` suite, which writes the
repository at real size (bench.bagel_wide_weights) and decodes its peer's latents with diffusers (bench.bagel_peer).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch


def write_bagel_configs(repo: Path, llm: dict[str, Any], vit: dict[str, Any]) -> None:
    """llm_config.json (Qwen2's fields) and vit_config.json (SigLIP's) as BAGEL-7B-MoT publishes them, from
    `bagel_mot_lm` / `siglip_vit` dims; SigLIP's layer count is one more than the node's (BAGEL drops one)."""
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "rope_theta", "rms_norm_eps")
    (repo / "llm_config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "tie_word_embeddings": False,
        **{k: llm[k] for k in keys}}))
    (repo / "vit_config.json").write_text(json.dumps({
        "model_type": "siglip_vision_model", "num_hidden_layers": vit["num_hidden_layers"] + 1,
        "image_size": vit["patch_size"] * vit["max_num_patch_per_side"],
        **{k: vit[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "patch_size",
                                "layer_norm_eps")}}))


def flux_layout(diffusers_state: dict[str, torch.Tensor], levels: int) -> dict[str, torch.Tensor]:
    """diffusers AutoencoderKL names -> the original FLUX / LDM names BAGEL publishes in ae.safetensors."""
    out = {}
    for name, t in diffusers_state.items():
        up = re.match(r"decoder\.up_blocks\.(\d+)\.", name)
        if up:
            name = f"decoder.up.{levels - 1 - int(up.group(1))}.{name[up.end():]}"
        name = re.sub(r"(down|up)_blocks\.(\d+)\.resnets\.", r"\1.\2.block.", name)
        name = re.sub(r"^(decoder\.up\.\d+\.)resnets\.", r"\1block.", name)
        name = re.sub(r"down_blocks\.(\d+)\.downsamplers\.0\.", r"down.\1.downsample.", name)
        name = re.sub(r"^(decoder\.up\.\d+\.)upsamplers\.0\.", r"\1upsample.", name)
        name = name.replace("conv_shortcut", "nin_shortcut").replace("conv_norm_out", "norm_out")
        name = re.sub(r"mid_block\.resnets\.(\d)\.", lambda m: f"mid.block_{int(m.group(1)) + 1}.", name)
        name = name.replace("mid_block.attentions.0.group_norm", "mid.attn_1.norm")
        name = re.sub(r"mid_block\.attentions\.0\.to_(q|k|v)\.", r"mid.attn_1.\1.", name)
        name = name.replace("mid_block.attentions.0.to_out.0", "mid.attn_1.proj_out")
        if re.search(r"attn_1\.(q|k|v|proj_out)\.weight$", name):
            t = t[:, :, None, None]                                   # (C, C) linear as a 1x1 convolution
        out[name] = t.contiguous()
    return out


def diffusers_vae(dims: dict[str, Any], args: dict[str, Any]) -> Any:
    """diffusers' AutoencoderKL with a `vae_decoder` node's dims (FLUX: no quant convs), seeded."""
    from diffusers import AutoencoderKL
    levels = len(dims["block_out_channels"])
    torch.manual_seed(0)
    return AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * levels,
        up_block_types=["UpDecoderBlock2D"] * levels, block_out_channels=list(dims["block_out_channels"]),
        layers_per_block=dims["layers_per_block"], latent_channels=dims["latent_channels"],
        norm_num_groups=dims["norm_num_groups"], use_quant_conv=False, use_post_quant_conv=False,
        scaling_factor=args["scaling_factor"], shift_factor=args["shift_factor"]).eval()


def reference_vae(flux_state: dict[str, torch.Tensor], vae_node):
    """diffusers' AutoencoderKL filled from the original FLUX / LDM layout by diffusers' own converter."""
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint
    model = diffusers_vae(vae_node.dims, vae_node.args)
    levels = len(vae_node.dims["block_out_channels"])
    state = convert_ldm_vae_checkpoint(flux_state, {"down_block_types": ["DownEncoderBlock2D"] * levels,
                                                    "up_block_types": ["UpDecoderBlock2D"] * levels})
    model.load_state_dict(state, strict=True)
    return model
