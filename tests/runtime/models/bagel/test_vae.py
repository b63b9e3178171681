"""`vae_encoder` / `vae_decoder` equal diffusers' AutoencoderKL (FLUX layout) on the same
weights, with FLUX's latent normalisation; batches equal their members one at a time."""
from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKL
from safetensors.torch import save_file

from mstar_compiler.catalogue import load_catalogue
from runtime.model_executor.components import component_class

CAT = load_catalogue()
DIMS = CAT["vae_encoder"].presets["tiny"]
ARGS = dict(CAT["vae_encoder"].args)
SCALE, SHIFT = ARGS["scaling_factor"], ARGS["shift_factor"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.manual_seed(0)
    n = len(DIMS["block_out_channels"])
    hf = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * n,
        up_block_types=["UpDecoderBlock2D"] * n, block_out_channels=list(DIMS["block_out_channels"]),
        layers_per_block=DIMS["layers_per_block"], latent_channels=DIMS["latent_channels"],
        norm_num_groups=DIMS["norm_num_groups"], use_quant_conv=False, use_post_quant_conv=False,
        scaling_factor=SCALE, shift_factor=SHIFT).eval()
    # each component reads a file of its own diffusers-named half (splitting one file between them is
    # the graph's mapping: tests/runtime/weights/test_published_loading.py)
    tmp = tmp_path_factory.mktemp("vae")
    for half in ("encoder", "decoder"):
        own = {k: v for k, v in hf.state_dict().items() if k.startswith(f"{half}.")}
        save_file(own, str(tmp / f"{half}.safetensors"))
    enc = component_class("vae_encoder")(DIMS, {**ARGS, "weights": str(tmp / "encoder.safetensors")}).eval()
    dec = component_class("vae_decoder")(DIMS, {**ARGS, "weights": str(tmp / "decoder.safetensors")}).eval()
    return hf, enc, dec


def test_encoder_matches_diffusers(models):
    hf, enc, _ = models
    image = torch.rand(1, 3, 32, 48) * 2 - 1
    with torch.no_grad():
        want = (hf.encode(image).latent_dist.mean - SHIFT) * SCALE
    (got,) = enc([image[0]])
    assert got.shape == (16, 4, 6)
    # fp32, diffusers' VAE against ours on the same weights: the same convolutions, which a backend may block
    # otherwise for another layout: a few ulps (eps 1.2e-7) per layer; measured exact here
    torch.testing.assert_close(got, want[0], rtol=1e-4, atol=1e-5)


def test_decoder_matches_diffusers(models):
    hf, _, dec = models
    latent = torch.randn(1, 16, 4, 6)
    with torch.no_grad():
        want = hf.decode(latent / SCALE + SHIFT).sample
    (got,) = dec([latent[0]])
    assert got.shape == (3, 32, 48)
    # as the encoder: measured exact here, a few fp32 ulps per layer allowed
    torch.testing.assert_close(got, want[0], rtol=1e-4, atol=1e-5)


def test_batches_equal_members(models):
    _, enc, dec = models
    images = [torch.rand(3, h, w) * 2 - 1 for h, w in [(32, 32), (16, 32), (32, 32)]]
    latents = enc(images)
    for image, latent in zip(images, latents):
        # a batch of images against one: convolutions over another batch size pick other blockings, fp32 order
        # differences through the layers; measured max 6.3e-7 at |z| <= 0.42, 6% of the bound
        torch.testing.assert_close(latent, enc([image])[0], rtol=1e-4, atol=1e-5)
    decoded = dec(latents)
    for latent, image in zip(latents, decoded):
        # the decoder's deeper stack carries more of them: measured max 5.6e-6 at |x| <= 2.1, 37% of the bound
        torch.testing.assert_close(image, dec([latent])[0], rtol=1e-4, atol=1e-5)
