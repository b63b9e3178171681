"""Building blocks of the FLUX VAE (an SD-style KL autoencoder), diffusers' layout.

Parameter names follow diffusers' `AutoencoderKL` (`resnets.N.norm1`, `conv_shortcut`,
`downsamplers.0.conv`, `attentions.0.to_q`, `to_out.0`, ...), which is how the FLUX VAE
is published on the HF hub. Shared by `vae_encoder` and `vae_decoder`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

EPS = 1e-6


class ResnetBlock2D(nn.Module):
    def __init__(self, cin: int, cout: int, groups: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin, eps=EPS)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, cout, eps=EPS)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.conv_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (x if self.conv_shortcut is None else self.conv_shortcut(x)) + h


class SpatialAttention(nn.Module):
    """Single-head self-attention over all pixels of a feature map, with a residual."""

    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.group_norm = nn.GroupNorm(groups, channels, eps=EPS)
        self.to_q = nn.Linear(channels, channels)
        self.to_k = nn.Linear(channels, channels)
        self.to_v = nn.Linear(channels, channels)
        self.to_out = nn.ModuleList([nn.Linear(channels, channels)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        tokens = self.group_norm(x).reshape(b, c, h * w).transpose(1, 2)  # (B, HW, C)
        q, k, v = (proj(tokens)[:, None] for proj in (self.to_q, self.to_k, self.to_v))  # (B, 1, HW, C)
        out = self.to_out[0](F.scaled_dot_product_attention(q, k, v)[:, 0])
        return x + out.transpose(1, 2).reshape(b, c, h, w)


class MidBlock(nn.Module):
    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock2D(channels, channels, groups) for _ in range(2)])
        self.attentions = nn.ModuleList([SpatialAttention(channels, groups)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.resnets[0](x)
        return self.resnets[1](self.attentions[0](x))


class Downsample(nn.Module):
    """Stride-2 3x3 conv after padding one row/column at the bottom/right."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    """Nearest-neighbour 2x upsampling followed by a 3x3 conv."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class DownBlock(nn.Module):
    def __init__(self, cin: int, cout: int, num_layers: int, groups: int, downsample: bool) -> None:
        super().__init__()
        self.resnets = nn.ModuleList(ResnetBlock2D(cin if i == 0 else cout, cout, groups)
                                     for i in range(num_layers))
        self.downsamplers = nn.ModuleList([Downsample(cout)] if downsample else [])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in (*self.resnets, *self.downsamplers):
            x = block(x)
        return x


class UpBlock(nn.Module):
    def __init__(self, cin: int, cout: int, num_layers: int, groups: int, upsample: bool) -> None:
        super().__init__()
        self.resnets = nn.ModuleList(ResnetBlock2D(cin if i == 0 else cout, cout, groups)
                                     for i in range(num_layers))
        self.upsamplers = nn.ModuleList([Upsample(cout)] if upsample else [])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in (*self.resnets, *self.upsamplers):
            x = block(x)
        return x


def group_by_shape(items: list[torch.Tensor]) -> dict[tuple[int, ...], list[int]]:
    """Indices of same-shaped tensors, so each group runs as one stacked batch."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(tuple(item.shape), []).append(i)
    return groups
