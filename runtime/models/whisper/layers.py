"""Whisper's attention block, named as transformers' checkpoints name it (`q_proj`, `k_proj` without a
bias, `v_proj`, `out_proj`)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class Attention(nn.Module):
    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        """(..., T, d_model) -> (..., T, heads, head_dim)."""
        return x.unflatten(-1, (self.num_heads, self.head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Full (bidirectional) self-attention of (B, T, d_model)."""
        q, k, v = (self.heads(p(x)).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        return self.out_proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))

