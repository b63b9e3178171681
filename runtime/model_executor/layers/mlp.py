"""SwiGLU MLP with fused gate/up projection: down(silu(gate(x)) * up(x))."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.model_executor.kernels import cpu as cpu_kernels
from runtime.model_executor.parallel import ColumnParallelLinear, RowParallelLinear, TensorParallelGroup
from runtime.model_executor.weights import Slot


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool, tp: TensorParallelGroup) -> None:
        super().__init__()
        self.hidden_size, self.intermediate_size, self.bias = hidden_size, intermediate_size, bias
        self.gate_up_proj = ColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias=bias, tp=tp)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias, tp=tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if gate_up.dim() == 2 and cpu_kernels.usable(gate_up):
            return self.down_proj(cpu_kernels.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)

    def slots(self, prefix: str) -> dict[str, Slot]:
        h, i = self.hidden_size, self.intermediate_size
        slots = {
            f"{prefix}gate_proj.weight": Slot((i, h), lambda t: self.gate_up_proj.load_weight(0, t)),
            f"{prefix}up_proj.weight": Slot((i, h), lambda t: self.gate_up_proj.load_weight(1, t)),
            f"{prefix}down_proj.weight": Slot((h, i), lambda t: self.down_proj.load_weight(0, t)),
        }
        if self.bias:
            slots[f"{prefix}gate_proj.bias"] = Slot((i,), lambda t: self.gate_up_proj.load_bias(0, t))
            slots[f"{prefix}up_proj.bias"] = Slot((i,), lambda t: self.gate_up_proj.load_bias(1, t))
            slots[f"{prefix}down_proj.bias"] = Slot((h,), lambda t: self.down_proj.load_bias(0, t))
        return slots
