"""The talker's own layers, built on the shared decoder layers of `runtime/model_executor/layers/`.

What the talker adds to a Qwen3-MoE decoder layer:
  * `MRotaryEmbedding` — interleaved M-RoPE over (temporal, height, width) positions,
    a drop-in for `runtime.model_executor.layers.rotary.RotaryEmbedding` (same call);
  * `SharedExpertMoE` — the routed experts of `SparseMoE` plus an always-on SwiGLU
    shared expert scaled by a sigmoid gate (Qwen2-MoE style);
  * `ResizeMLP` — fc1, SiLU, fc2 (biased): the `text_projection` / `hidden_projection`
    that take thinker-width states to the talker's width.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from runtime.model_executor.layers.config import DecoderConfig
from runtime.model_executor.layers.mlp import GatedMLP
from runtime.model_executor.layers.moe import SparseMoE
from runtime.model_executor.parallel import TensorParallelGroup
from runtime.models.qwen3_omni.rope import apply_rope, mrope_cos_sin
from runtime.model_executor.weights import Slot


class MRotaryEmbedding(nn.Module):
    """Rotate q and k by 3-D positions (3, N); 1-D positions (N,) mean t = h = w."""

    def __init__(self, head_dim: int, theta: float, section: Sequence[int]) -> None:
        super().__init__()
        self.head_dim, self.theta, self.section = head_dim, theta, tuple(section)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.dim() == 1:
            positions = positions.expand(3, -1)  # (3, N)
        cos, sin = mrope_cos_sin(positions, self.head_dim, self.theta, self.section)  # (N, D)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)


class SharedExpertMoE(SparseMoE):
    """Routed experts + sigmoid(gate(x)) * shared_expert(x)."""

    def __init__(self, config: DecoderConfig, shared_intermediate: int, tp: TensorParallelGroup) -> None:
        super().__init__(config, tp)
        self.shared_expert = GatedMLP(config.hidden_size, shared_intermediate, False, tp)
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)

    def slots(self, prefix: str) -> dict[str, Slot]:
        slots = super().slots(prefix)
        slots.update(self.shared_expert.slots(f"{prefix}shared_expert."))
        slots[f"{prefix}shared_expert_gate.weight"] = Slot(
            (1, self.gate.in_features), lambda t: _copy(self.shared_expert_gate.weight, t))
        return slots


class ResizeMLP(nn.Module):
    """linear_fc2(silu(linear_fc1(x))): thinker width -> talker width."""

    def __init__(self, n_in: int, n_mid: int, n_out: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(n_in, n_mid)
        self.linear_fc2 = nn.Linear(n_mid, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


@torch.no_grad()
def _copy(param: torch.Tensor, tensor: torch.Tensor) -> None:
    param.copy_(tensor)
