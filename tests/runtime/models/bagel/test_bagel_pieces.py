"""Shared BAGEL pieces: flow schedule, patch packing, fixed embeddings, image I/O."""
from __future__ import annotations

import math

import pytest
import torch
from PIL import Image

from bench.bagel_upstream_lm import bagel_sincos_table
from runtime.models.bagel.embeddings import TimestepEmbedder, sincos_2d_table, timestep_frequencies
from runtime.models.bagel.flow import flow_step_times, flow_timesteps
from runtime.entrypoints.http.multimodal import decode_image
from runtime.models.bagel.image_io import VAE_RESIZE, VIT_RESIZE, resize_for, target_size
from runtime.model_executor.images import pil_to_tensor, png_bytes
from runtime.models.bagel.patchify import grid_position_ids, patchify, unpatchify


@pytest.mark.parametrize("n, shift", [(2, 1.0), (5, 3.0), (50, 3.0)])
def test_flow_schedule(n, shift):
    t = flow_timesteps(n, shift)
    assert t.shape == (n,) and t[0] == 1.0 and t[-1] == 0.0
    for i in range(n):
        plain = 1 - i / (n - 1)
        # fp32 timesteps against the float64 formula: one fp32 rounding of values <= 1 (6e-8)
        assert math.isclose(float(t[i]), shift * plain / (1 + (shift - 1) * plain), abs_tol=1e-6)
    assert torch.all(t[1:] < t[:-1])
    assert flow_step_times(n, shift, n - 2) == (float(t[-2]), 0.0)
    with pytest.raises(ValueError):
        flow_step_times(n, shift, n - 1)


def test_patchify_is_bagels_packing_and_inverts():
    x = torch.randn(16, 4, 6)
    tokens = patchify(x, 2)
    assert tokens.shape == (6, 64)
    # token (row 1, column 2), inside it (py=1, px=0, channel 5)
    assert tokens[1 * 3 + 2, (1 * 2 + 0) * 16 + 5] == x[5, 2 * 1 + 1, 2 * 2 + 0]
    torch.testing.assert_close(unpatchify(tokens, 4, 6, 2), x, rtol=0, atol=0)
    assert grid_position_ids(2, 3, 8).tolist() == [0, 1, 2, 8, 9, 10]
    with pytest.raises(ValueError):
        grid_position_ids(9, 1, 8)


def test_sincos_table_matches_bagel():
    # two writings of the same table of sines and cosines: measured exact; torch's fp32 defaults (rtol 1.3e-6, atol
    # 1e-5) leave the ulp an angle computed in another order could cost
    torch.testing.assert_close(sincos_2d_table(64, 5), bagel_sincos_table(64, 5))


def test_timestep_embedder_follows_dit():
    torch.manual_seed(0)
    emb = TimestepEmbedder(32, frequency_dim=8)
    t = torch.tensor([0.0, 0.5, 1.0])
    freqs = torch.exp(-math.log(10000) * torch.arange(4) / 4)
    want = torch.cat([torch.cos(t[:, None] * freqs), torch.sin(t[:, None] * freqs)], dim=-1)
    # the same exp, cos and sin in fp32: measured exact, an ulp allowed by torch's fp32 defaults (as above)
    torch.testing.assert_close(timestep_frequencies(t, 8), want)
    torch.testing.assert_close(emb(t), emb.mlp(want))  # the MLP on those: measured exact, an ulp allowed


@pytest.mark.parametrize("size, policy, want", [
    ((1024, 768), VAE_RESIZE, (1024, 768)),
    ((300, 200), VAE_RESIZE, (768, 512)),      # short edge up to 512, sides multiples of 16
    ((4000, 1000), VAE_RESIZE, (1024, 256)),   # long edge down to 1024
    ((500, 500), VIT_RESIZE, (504, 504)),      # multiples of 14
])
def test_bagel_resize_sizes(size, policy, want):
    assert target_size(*size, policy) == want


def test_image_round_trip():
    image = Image.new("RGB", (40, 24), (255, 0, 128))
    x = pil_to_tensor(image)
    assert x.shape == (3, 24, 40)
    # 128 / 255 * 2 - 1 in fp32 against float64 rounded once: an ulp (6e-8) apart; measured 5.9e-8
    torch.testing.assert_close(x[:, 0, 0], torch.tensor([1.0, -1.0, 128 / 255 * 2 - 1]))
    back = decode_image(png_bytes(x), "image")
    assert back.size == (40, 24) and back.getpixel((3, 3)) == (255, 0, 128)
    assert resize_for(image, VAE_RESIZE).size == target_size(40, 24, VAE_RESIZE)
