"""Tiny checkpoints in their publishers' layouts loaded by the worker's loader through the seed
graphs' mappings, outputs equal to the reference implementations fed the same files.

* BAGEL's `ae.safetensors`: the original FLUX autoencoder layout (down/up blocks counted as FLUX
  counts them, attention as 1x1 convolutions); the file is checked to be that layout by diffusers'
  own converter, and our VAE equals diffusers' AutoencoderKL.
* V-JEPA 2-AC's `.pt`: a torch pickle of {encoder, predictor} under `module.backbone.` with fused
  qkv, converted by `convert-weights`; our encoder equals transformers' VJEPA2Model.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from diffusers import AutoencoderKL
from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint
from safetensors.torch import save_file

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.weights.commands import convert_dir
from runtime.weights.sources import NodeWeights
from runtime.worker.loader import load_node
from tests.runtime.models.vjepa2.vjepa2_reference import hf_encoder, make
from tests.runtime.serving.published_layouts import PRESET, published_preset


def flux_layout(diffusers_state: dict[str, torch.Tensor], levels: int) -> dict[str, torch.Tensor]:
    """diffusers AutoencoderKL names -> the original FLUX / LDM names BAGEL publishes."""
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


@pytest.fixture(scope="module")
def bagel(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("bagel-published")
    plan = compile_file(str(published_preset(tmp, "bagel", "bagel-7b")), Options(preset=PRESET)).plan
    dims, args = plan.node("vae_dec").dims, plan.node("vae_dec").args
    levels = len(dims["block_out_channels"])
    torch.manual_seed(0)
    hf = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * levels,
        up_block_types=["UpDecoderBlock2D"] * levels, block_out_channels=list(dims["block_out_channels"]),
        layers_per_block=dims["layers_per_block"], latent_channels=dims["latent_channels"],
        norm_num_groups=dims["norm_num_groups"], use_quant_conv=False, use_post_quant_conv=False,
        scaling_factor=args["scaling_factor"], shift_factor=args["shift_factor"]).eval()
    repo = tmp / "weights" / "BAGEL-7B-MoT"
    repo.mkdir(parents=True)
    flux = flux_layout(hf.state_dict(), levels)
    save_file(flux, str(repo / "ae.safetensors"))
    return plan, hf, repo, flux


def test_the_file_is_flux_layout_by_diffusers_own_converter(bagel) -> None:
    _, hf, _, flux = bagel
    assert any(k.startswith("decoder.up.0.block.") for k in flux) and "encoder.mid.attn_1.q.weight" in flux
    back = convert_ldm_vae_checkpoint(dict(flux), dict(hf.config))
    want = hf.state_dict()
    assert set(back) == set(want)
    for name, t in want.items():
        assert torch.equal(back[name].reshape(t.shape), t), name


def test_bagel_vae_from_flux_layout_equals_diffusers(bagel) -> None:
    plan, hf, repo, _ = bagel
    node_enc, node_dec = plan.node("vae_enc"), plan.node("vae_dec")
    enc = load_node(node_enc, NodeWeights("mapped", str(repo))).eval()
    dec = load_node(node_dec, NodeWeights("mapped", str(repo))).eval()
    scale, shift = node_dec.args["scaling_factor"], node_dec.args["shift_factor"]
    image, latent = torch.rand(1, 3, 32, 48) * 2 - 1, torch.randn(1, 16, 4, 6)
    with torch.no_grad():
        want_latent = (hf.encode(image).latent_dist.mean - shift) * scale
        want_image = hf.decode(latent / scale + shift).sample
        (got_latent,), (got_image,) = enc([image[0]]), dec([latent[0]])
    # fp32 both sides, the same convolutions: differences of a few ulps
    torch.testing.assert_close(got_latent, want_latent[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_image, want_image[0], rtol=1e-4, atol=1e-5)


def upstream_encoder(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers VJEPA2Model encoder tensors -> upstream vision_transformer.py names, q/k/v fused."""
    out = {}
    for name, t in hf_state.items():
        if not name.startswith("encoder.") or re.search(r"attention\.(key|value)\.", name):
            continue
        q = re.match(r"encoder\.layer\.(\d+)\.attention\.query\.(weight|bias)", name)
        if q:
            i, kind = q.groups()
            parts = [hf_state[f"encoder.layer.{i}.attention.{p}.{kind}"] for p in ("query", "key", "value")]
            out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat(parts)
            continue
        name = re.sub(r"^encoder\.layer\.(\d+)\.attention\.", r"blocks.\1.attn.", name)
        name = re.sub(r"^encoder\.layer\.(\d+)\.", r"blocks.\1.", name)
        name = name.replace("encoder.layernorm.", "norm.")
        name = name.replace("encoder.embeddings.patch_embeddings.", "patch_embed.")
        out[name] = t
    return out


def test_vjepa2_encoder_from_the_ac_pickle_equals_transformers(tmp_path: Path) -> None:
    plan = compile_file(str(published_preset(tmp_path, "vjepa2_ac", "vitg")), Options(preset=PRESET)).plan
    node = plan.node("encoder")
    torch.manual_seed(1)
    ref = hf_encoder(node.dims)
    predictor = make("vjepa2_ac_predictor", seed=2)
    repo = tmp_path / "weights" / "vjepa2"
    repo.mkdir(parents=True)
    checkpoint = {"encoder": {f"module.backbone.{k}": v for k, v in upstream_encoder(ref.state_dict()).items()},
                  "predictor": {f"module.backbone.{k}": v for k, v in predictor.state_dict().items()},
                  "epoch": 315}
    torch.save(checkpoint, repo / "vjepa2-ac-vitg.pt")
    assert convert_dir(repo) and (repo / "vjepa2-ac-vitg.safetensors").is_file()
    ours = load_node(node, NodeWeights("mapped", str(repo))).eval()
    loaded = load_node(plan.node("predictor"), NodeWeights("mapped", str(repo)))
    for (name, got), want in zip(loaded.state_dict().items(), predictor.state_dict().values()):
        assert torch.equal(got, want), name
    video = torch.randn(2, 4, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got, want = ours(video), ref.get_vision_features(video)
    want = torch.nn.functional.layer_norm(want, want.shape[-1:])      # the graph's normalize_reps, as native
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
