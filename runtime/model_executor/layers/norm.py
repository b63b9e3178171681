"""RMSNorm as in Llama/Qwen: normalise in fp32, scale by a learned weight in the input dtype."""
from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    @torch.no_grad()
    def load_weight(self, part: int, full: torch.Tensor) -> None:
        self.weight.copy_(full)
