"""Component `vae_decoder`: FLUX VAE decoder, latent (16, h, w) -> image (3, 8h, 8w).

The latent is first un-normalised as FLUX does: z / scaling_factor + shift_factor
(args; FLUX: 0.3611, 0.1159). The image is in [-1, 1] up to the decoder's overshoot
(`runtime.model_executor.images.tensor_to_pil` clamps). Parameter names are diffusers'
`AutoencoderKL` names under `decoder.`.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from runtime.models.bagel.vae_blocks import MidBlock, UpBlock, group_by_shape
from runtime.models.bagel.weights import init_weights, seeded


class Decoder(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        ch, groups, n = d["block_out_channels"][::-1], d["norm_num_groups"], d["layers_per_block"]
        self.conv_in = nn.Conv2d(d["latent_channels"], ch[0], 3, padding=1)
        self.mid_block = MidBlock(ch[0], groups)
        self.up_blocks = nn.ModuleList(
            UpBlock(ch[max(i - 1, 0)], c, n + 1, groups, upsample=i < len(ch) - 1)
            for i, c in enumerate(ch))
        self.conv_norm_out = nn.GroupNorm(groups, ch[-1], eps=1e-6)
        self.conv_out = nn.Conv2d(ch[-1], d["in_channels"], 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.mid_block(self.conv_in(z))
        for block in self.up_blocks:
            x = block(x)
        return self.conv_out(F.silu(self.conv_norm_out(x)))  # (B, 3, H, W)


class VaeDecoder(nn.Module):
    """Normalised latents -> images, 8x larger per side."""
    kind = "vae_decoder"

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any]) -> None:
        super().__init__()
        self.scaling_factor = float(args.get("scaling_factor", 0.3611))
        self.shift_factor = float(args.get("shift_factor", 0.1159))
        with seeded(int(args.get("seed", 0))):
            self.decoder = Decoder(dims)
        init_weights(self, args)

    @torch.inference_mode()
    def forward(self, latents: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """latents: (16, h, w) each -> images (3, 8h, 8w) each."""
        out: list[torch.Tensor] = [torch.empty(0)] * len(latents)
        dtype = self.decoder.conv_in.weight.dtype
        for indices in group_by_shape(list(latents)).values():
            z = torch.stack([latents[i] for i in indices]).to(dtype)
            images = self.decoder(z / self.scaling_factor + self.shift_factor)
            for i, image in zip(indices, images):
                out[i] = image
        return out
