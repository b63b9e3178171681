"""Tiny checkpoints in their publishers' layouts loaded by the worker's loader through the seed
graphs' mappings, outputs equal to the reference implementations fed the same files.

* BAGEL's `ae.safetensors`: the original FLUX autoencoder layout (down/up blocks counted as FLUX
  counts them, attention as 1x1 convolutions); the file is checked to be that layout by diffusers'
  own converter, and our VAE equals diffusers' AutoencoderKL.

V-JEPA 2-AC's `.pt` is served end to end in tests/runtime/serving/test_published_vjepa2.py.
"""
from __future__ import annotations

import pytest
import torch
from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint
from safetensors.torch import save_file

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.model_executor.weights.sources import NodeWeights
from runtime.worker.loader import load_node
from bench.bagel_layout import diffusers_vae, flux_layout
from tests.runtime.serving.published_layouts import PRESET, published_preset


@pytest.fixture(scope="module")
def bagel(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("bagel-published")
    plan = compile_file(str(published_preset(tmp, "bagel", "bagel-7b")), Options(preset=PRESET)).plan
    dims, args = plan.node("vae_dec").dims, plan.node("vae_dec").args
    levels = len(dims["block_out_channels"])
    hf = diffusers_vae(dims, args)
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
    # fp32 both sides, the same convolutions (diffusers' and ours may pick other conv kernels for their layouts):
    # differences of a few ulps (eps 1.2e-7) on values <= 1.3; measured exact on the test checkpoint here
    torch.testing.assert_close(got_latent, want_latent[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_image, want_image[0], rtol=1e-4, atol=1e-5)  # the same few-ulp bound
