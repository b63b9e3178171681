"""Component `vae_encoder`: FLUX VAE encoder, image (3, H, W) -> latent (16, H/8, W/8).

The latent is the mean of the encoder's Gaussian posterior, normalised as FLUX does:
scaling_factor * (mean - shift_factor) (args; FLUX: 0.3611, 0.1159). BAGEL samples the
posterior instead; serving uses its mean so that the same request gives the same image.
Parameter names are diffusers' `AutoencoderKL` names under `encoder.`.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from runtime.models.bagel.vae_blocks import DownBlock, MidBlock, group_by_shape
from runtime.models.bagel.weights import init_weights, seeded


class Encoder(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        ch, groups, n = d["block_out_channels"], d["norm_num_groups"], d["layers_per_block"]
        self.conv_in = nn.Conv2d(d["in_channels"], ch[0], 3, padding=1)
        self.down_blocks = nn.ModuleList(
            DownBlock(ch[max(i - 1, 0)], c, n, groups, downsample=i < len(ch) - 1)
            for i, c in enumerate(ch))
        self.mid_block = MidBlock(ch[-1], groups)
        self.conv_norm_out = nn.GroupNorm(groups, ch[-1], eps=1e-6)
        self.conv_out = nn.Conv2d(ch[-1], 2 * d["latent_channels"], 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        x = self.mid_block(x)
        return self.conv_out(F.silu(self.conv_norm_out(x)))  # (B, 2 * latent_channels, h, w)


class VaeEncoder(nn.Module):
    """Images -> normalised latents, 8x smaller per side."""
    kind = "vae_encoder"

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any]) -> None:
        super().__init__()
        self.latent_channels = dims["latent_channels"]
        self.scaling_factor = float(args.get("scaling_factor", 0.3611))
        self.shift_factor = float(args.get("shift_factor", 0.1159))
        with seeded(int(args.get("seed", 0))):
            self.encoder = Encoder(dims)
        init_weights(self, args)

    @torch.inference_mode()
    def forward(self, images: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """images: (3, H, W) each in [-1, 1], H and W multiples of 8 -> (16, H/8, W/8) each."""
        out: list[torch.Tensor] = [torch.empty(0)] * len(images)
        dtype = self.encoder.conv_in.weight.dtype
        for indices in group_by_shape(list(images)).values():
            moments = self.encoder(torch.stack([images[i] for i in indices]).to(dtype))
            mean = moments[:, : self.latent_channels]
            latents = self.scaling_factor * (mean - self.shift_factor)
            for i, latent in zip(indices, latents):
                out[i] = latent
        return out
