"""Rotary position embedding (RoPE), "rotate half" layout, with Llama-3 frequency scaling.

Positions are given per token row, so packed batches of requests at different positions
need no padding. Inverse frequencies stay fp32 whatever dtype the model is cast to (a
bf16 copy would shift long-range angles), kept per device outside the module's buffers;
cos/sin are computed for the rows at hand in fp32.

Multimodal RoPE (Qwen3-Omni's thinker): when `rope_scaling` carries an `mrope_section`
(t, h, w), positions may be (3, N) — temporal, height and width position of each row —
and frequency lane j takes its angle from the height position when j % 3 == 1 and
j < 3*h, from the width position when j % 3 == 2 and j < 3*w, else from the temporal
one (the interleaved layout). Text rows have three equal positions, which is plain RoPE,
so (N,) positions are accepted too.

A model computes `cos_sin(positions)` once per forward and every layer rotates with
`rotate(x, cos, sin)`: the angles depend only on the positions, not on the layer.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import torch
from torch import nn


def inverse_frequencies(head_dim: int, theta: float, scaling: Mapping[str, Any] | None) -> torch.Tensor:
    """(head_dim/2,) fp32 inverse frequencies; `scaling` is an HF `rope_scaling` dict or None."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv
    if kind == "llama3":
        return _llama3(inv, scaling)
    raise ValueError(f"rope_scaling type {kind!r} is not supported (default, llama3)")


def _llama3(inv: torch.Tensor, s: Mapping[str, Any]) -> torch.Tensor:
    # long wavelengths are slowed by `factor`, short ones kept, the band between interpolated
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_mid, blended, scaled)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, theta: float, scaling: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.inv_freq = inverse_frequencies(head_dim, theta, scaling)     # (D/2,) fp32, CPU
        self._inv_freq_on: dict[torch.device, torch.Tensor] = {}
        self.mrope_section: tuple[int, ...] | None = tuple((scaling or {}).get("mrope_section") or ()) or None

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q (N, Hq, D) and k (N, Hkv, D) by their rows' positions (N,) or, for M-RoPE, (3, N)."""
        cos, sin = self.cos_sin(positions, q.dtype)
        return rotate(q, cos, sin), rotate(k, cos, sin)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sign-folded sin (N, 1, D) of the rows' angles, computed in fp32 and cast to `dtype`.

        The sin half that multiplies the first half of a head is negated here, so `rotate`
        needs no negation: rotate_half(x) * sin == swap_halves(x) * folded_sin.
        """
        freqs = positions.float()[..., None] * self._inv_freq_for(positions.device)  # (N, D/2) or (3, N, D/2)
        if positions.dim() == 2:
            freqs = self._interleave(freqs)
        freqs = freqs[:, None, :]                                       # (N, 1, D/2)
        cos, sin = freqs.cos(), freqs.sin()
        return torch.cat((cos, cos), dim=-1).to(dtype), torch.cat((-sin, sin), dim=-1).to(dtype)  # (N, 1, D)

    def _inv_freq_for(self, device: torch.device) -> torch.Tensor:
        if device not in self._inv_freq_on:
            self._inv_freq_on[device] = self.inv_freq.to(device)
        return self._inv_freq_on[device]

    def _interleave(self, freqs: torch.Tensor) -> torch.Tensor:
        if self.mrope_section is None:
            raise ValueError("(3, N) positions need a rope_scaling with an mrope_section")
        picked = freqs[0].clone()                                      # (N, D/2), temporal lanes
        for axis in (1, 2):
            lanes = slice(axis, 3 * self.mrope_section[axis], 3)
            picked[:, lanes] = freqs[axis, :, lanes]
        return picked


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (N, H, D) rotated by `cos_sin`'s (N, 1, D) tables (in x's dtype)."""
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return torch.addcmul(x * cos, swapped, sin)
