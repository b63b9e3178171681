"""Rotary embeddings beyond 1-D positions (which `runtime/model_executor/layers/rotary.py` covers).

Rotate-half convention (the first and second half of a head are real and imaginary parts):
  * `mrope_cos_sin` — the talker's 3-D positions (temporal, height, width) in the
    *interleaved* M-RoPE layout of Qwen3-Omni: frequency j takes its angle from the height
    position when j % 3 == 1 and j < 3·section[1], from the width position when
    j % 3 == 2 and j < 3·section[2], and from the temporal position otherwise. For
    text-only prompts the three positions are equal and this is plain RoPE;
  * `apply_rope` — rotate by precomputed cos/sin (also the vision encoder's 2-D rotary).
"""
from __future__ import annotations

from typing import Sequence

import torch

from runtime.model_executor.layers.rotary import inverse_frequencies


def mrope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, section: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (*positions.shape[1:], head_dim) for (3, ...) positions (t, h, w)."""
    inv_freq = inverse_frequencies(head_dim, theta, None).to(positions.device)
    angles = positions.to(torch.float32)[..., None] * inv_freq  # (3, ..., head_dim / 2)
    picked = angles[0].clone()
    for axis in (1, 2):
        lanes = slice(axis, section[axis] * 3, 3)
        picked[..., lanes] = angles[axis][..., lanes]
    picked = torch.cat((picked, picked), dim=-1)
    return picked.cos(), picked.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` (..., T, heads, head_dim) by cos/sin (..., T, head_dim)."""
    cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
    return x * cos + _rotate_half(x) * sin
