"""Full-size `bagel` catalogue counts against the reference libraries and the Qwen2.5-7B
preset (modules built on the meta device: shapes only, no memory)."""
from __future__ import annotations

import torch
from diffusers import AutoencoderKL
from transformers import SiglipVisionConfig
from transformers import SiglipVisionModel as HFSiglipVisionModel

from mstar_compiler.catalogue import load_catalogue
from runtime.model_executor.components import component_class

CAT = load_catalogue()


def _count(module: torch.nn.Module, skip: str = "") -> int:
    return sum(p.numel() for name, p in module.named_parameters() if not (skip and name.startswith(skip)))


def _ours(kind: str) -> int:
    spec = CAT[kind]
    with torch.device("meta"):
        return _count(component_class(kind)(spec.presets["bagel-7b"], dict(spec.args)))


def test_flux_vae_counts_match_diffusers():
    d = CAT["vae_encoder"].presets["bagel-7b"]
    with torch.device("meta"):
        hf = AutoencoderKL(
            down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
            block_out_channels=list(d["block_out_channels"]), layers_per_block=2, latent_channels=16,
            use_quant_conv=False, use_post_quant_conv=False)
    assert _ours("vae_encoder") == CAT["vae_encoder"].num_params(d) == _count(hf.encoder)
    assert _ours("vae_decoder") == CAT["vae_decoder"].num_params(d) == _count(hf.decoder)
    assert 83e6 < _count(hf) < 85e6


def test_siglip_count_is_hf_tower_plus_bagel_connector():
    d = CAT["siglip_vit"].presets["bagel-7b"]
    config = SiglipVisionConfig(hidden_size=1152, intermediate_size=4304, num_hidden_layers=26,
                                num_attention_heads=16, image_size=980, patch_size=14)
    with torch.device("meta"):
        tower = _count(HFSiglipVisionModel(config), skip="head.")
    connector = 1152 * 3584 + 3584 + 3584 * 3584 + 3584
    assert _ours("siglip_vit") == CAT["siglip_vit"].num_params(d) == tower + connector + 70 * 70 * 3584


def test_mot_lm_is_qwen25_7b_plus_a_generation_expert():
    lm = CAT["bagel_mot_lm"].presets["bagel-7b"]
    qwen = CAT["qwen2_lm"].num_params(CAT["qwen2_lm"].presets["qwen2.5-7b"])
    layer = (qwen - 2 * 152064 * 3584 - 3584) // 28            # one Qwen2.5-7B layer
    gen_expert = 28 * (layer + 2 * 128) + 3584                 # + q/k norms; + norm_moe_gen
    und_qk_norms = 28 * 2 * 128
    extras = (256 * 3584 + 3584 + 3584 * 3584 + 3584) + 2 * 64 * 3584 + 3584 + 64 + 64 * 64 * 3584
    assert CAT["bagel_mot_lm"].num_params(lm) == qwen + und_qk_norms + gen_expert + extras
    total = sum(CAT[k].num_params(CAT[k].presets["bagel-7b"])
                for k in ("siglip_vit", "vae_encoder", "vae_decoder", "bagel_mot_lm", "cfg_combine"))
    # BAGEL's card says "14B total, 7B active", a figure rounded to the billion: the catalogue counts 13.31B, 4.9%
    # under it (measured), so 5% holds the published figure and a miscounted layer (>= 0.2B) still moves it out
    assert abs(total / 14e9 - 1) < 0.05, total
