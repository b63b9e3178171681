"""Layers shared by the V-JEPA 2 encoder and the AC predictor."""
from __future__ import annotations

import torch
from torch import nn


class Mlp(nn.Module):
    """fc1 -> exact GELU -> fc2 (names as both published checkpoints)."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, intermediate)
        self.fc2 = nn.Linear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.gelu(self.fc1(x)))


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, N, heads * D) -> (B, heads, N, D)."""
    b, n, _ = x.shape
    return x.view(b, n, num_heads, -1).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, heads, N, D) -> (B, N, heads * D)."""
    b, h, n, d = x.shape
    return x.transpose(1, 2).reshape(b, n, h * d)
