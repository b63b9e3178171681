"""BAGEL's fixed 2-D sin-cos position table and DiT timestep embedder.

Parameter names follow BAGEL's checkpoint: `<prefix>.pos_embed` (a frozen parameter,
present in the checkpoint) and `time_embedder.mlp.{0,2}.{weight,bias}`.
"""
from __future__ import annotations

import math

import torch
from torch import nn


def _sincos_1d(dim: int, pos: torch.Tensor) -> torch.Tensor:
    omega = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64) / (dim / 2.0))
    out = pos.reshape(-1).to(torch.float64)[:, None] * omega[None]  # (M, D/2)
    return torch.cat([out.sin(), out.cos()], dim=1)


def sincos_2d_table(dim: int, side: int) -> torch.Tensor:
    """(side*side, dim) table; row r*side + c encodes (row r, column c).

    As BAGEL (after MAE/DiT): the first half of the features encodes the column, the
    second half the row.
    """
    coords = torch.arange(side, dtype=torch.float64)
    rows = coords[:, None].expand(side, side)
    cols = coords[None, :].expand(side, side)
    return torch.cat([_sincos_1d(dim // 2, cols), _sincos_1d(dim // 2, rows)], dim=1).float()


class PositionEmbedding(nn.Module):
    """Frozen sin-cos table indexed by flattened grid position ids."""

    def __init__(self, max_per_side: int, hidden_size: int) -> None:
        super().__init__()
        self.pos_embed = nn.Parameter(sincos_2d_table(hidden_size, max_per_side), requires_grad=False)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.pos_embed[position_ids]


def timestep_frequencies(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """(N,) timesteps -> (N, dim) [cos | sin] features."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half)
    args = t[:, None].float() * freqs.to(t.device)[None]
    emb = torch.cat([args.cos(), args.sin()], dim=-1)
    return torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1) if dim % 2 else emb


class TimestepEmbedder(nn.Module):
    """Sinusoidal features of the flow timestep through a SiLU MLP (DiT's embedder)."""

    def __init__(self, hidden_size: int, frequency_dim: int = 256) -> None:
        super().__init__()
        self.frequency_dim = frequency_dim
        self.mlp = nn.Sequential(nn.Linear(frequency_dim, hidden_size), nn.SiLU(),
                                 nn.Linear(hidden_size, hidden_size))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        features = timestep_frequencies(t, self.frequency_dim).to(self.mlp[0].weight.dtype)
        return self.mlp(features)
