"""Gemma's pieces as π0.5 uses them (written here from transformers' Gemma definition): RMSNorm scaling by
1 + weight, the GELU-tanh gated MLP, attention projections without bias, rotary positions, and the
adaptive RMSNorm of π0.5's action expert (scale, shift and residual gate predicted from the step's time)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from runtime.model_executor.layers.rotary import RotaryEmbedding, rotate


class GemmaRMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).type_as(x)


class AdaptiveRMSNorm(nn.Module):
    """RMS norm whose scale, shift and residual gate come from the time embedding: (normed, gate)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(size, 3 * size)

    def forward(self, x: torch.Tensor, time: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        scale, shift, gate = self.dense(time)[:, None, :].chunk(3, dim=-1)
        return (xf * (1.0 + scale.float()) + shift.float()).to(x.dtype), gate.to(x.dtype)


class GemmaMLP(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class GemmaProjections(nn.Module):
    """q, k, v, o of one attention layer: (B, L, hidden) -> rotated q (B, heads, L, hd), k and v (B, kv, L, hd)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, n, _ = x.shape
        q = rotate(self.q_proj(x).view(b * n, self.heads, -1), cos, sin)
        k = rotate(self.k_proj(x).view(b * n, self.kv_heads, -1), cos, sin)
        v = self.v_proj(x).view(b * n, self.kv_heads, -1)
        return tuple(t.view(b, n, t.shape[1], -1).transpose(1, 2) for t in (q, k, v))

    def out(self, attended: torch.Tensor) -> torch.Tensor:
        """(B, heads, L, hd) -> (B, L, hidden)."""
        b, _, n, _ = attended.shape
        return self.o_proj(attended.transpose(1, 2).reshape(b, n, -1))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    """Bidirectional attention of q (B, H, L, hd) over k, v (B, KV, S, hd); `key_mask` (B, S) the real keys.
    Shared kv heads are repeated for SDPA: with `enable_gqa` the CPU leaves its fused kernel
    (docs/benchmark-log.md)."""
    mask = None if key_mask is None else key_mask[:, None, None, :]
    if k.shape[1] != q.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def rope_tables(rotary: RotaryEmbedding, positions: torch.Tensor, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin (B * L, 1, hd) of (B, L) positions, rows in batch order."""
    return rotary.cos_sin(positions.reshape(-1), dtype)
