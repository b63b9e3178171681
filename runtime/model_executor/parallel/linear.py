"""Column- and row-parallel linear layers (Megatron style) that load full HF tensors.

A column-parallel layer splits its output features over the group: every rank holds a
slice of each *part* of the output (q, k and v of a fused QKV projection; gate and up of
a fused SwiGLU projection), so each rank computes whole heads / whole channels with no
communication. A row-parallel layer splits its input features and sums the partial
products with an all-reduce. With a group of size 1 both are a plain linear (`runtime.model_executor.parallel.cpu_linear.linear`).

Weights are loaded from full (unsharded) checkpoint tensors: `load_weight(part, full)`
copies this rank's slice of `full` into place, so every rank can read the same file. A linear told
`quant_as_loaded(scheme)` while its model is built quantizes its weight as the parts arrive instead
(runtime.model_executor.parallel.quant): its dense weight is never whole.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from runtime.model_executor.parallel.cpu_linear import Packed, dense_gone, linear, pack_own_weight
from runtime.model_executor.parallel.group import SINGLE, TensorParallelGroup
from runtime.model_executor.parallel.quant import Assembly, check_shape, take
from runtime.model_executor.weights.slots import placeholders_loading


class _Linear(nn.Module):
    """What the two parallel linears share: their one packed or quantized copy, and loading into it."""

    weight: nn.Parameter
    packed: Packed | None
    quant: str = ""                     # the scheme it quantizes by as it loads ("" = dense)
    assembly: Assembly | None = None    # its rows loaded so far, while quantizing

    def pack_for_cpu(self) -> int:
        return pack_own_weight(self)

    def quant_as_loaded(self, scheme: str) -> None:
        """Quantize the weight by `scheme` as its parts load; the dense weight goes now (module doc)."""
        check_shape(scheme, *self.weight.shape)
        self.quant = scheme
        self.weight = dense_gone(self.weight)

    @torch.no_grad()
    def _store(self, rows: slice, values: torch.Tensor) -> None:
        if not self.quant:
            self.weight[rows].copy_(values)
        elif not placeholders_loading():
            if self.assembly is None:
                self.assembly = Assembly(*self.weight.shape, self.quant, self.weight.dtype)
            done = self.assembly.put(rows, values)
            if done is not None:
                self.packed, self.assembly = done, None


class ColumnParallelLinear(_Linear):
    """y = x W^T (+ b) where W stacks `out_parts`, each split over the group's ranks."""

    def __init__(self, in_features: int, out_parts: Sequence[int], bias: bool,
                 tp: TensorParallelGroup = SINGLE) -> None:
        super().__init__()
        self.tp = tp
        self.local_parts = [tp.shard(n, "output features") for n in out_parts]
        self.weight = nn.Parameter(torch.empty(sum(self.local_parts), in_features))
        self.bias = nn.Parameter(torch.empty(sum(self.local_parts))) if bias else None
        self.packed: Packed | None = None     # packed copy of the weight (runtime.model_executor.parallel.cpu_linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.packed)

    def _rows(self, part: int) -> slice:
        start = sum(self.local_parts[:part])
        return slice(start, start + self.local_parts[part])

    @torch.no_grad()
    def load_weight(self, part: int, full: torch.Tensor) -> None:
        """Copy this rank's rows of output part `part` from the full tensor (out_part, in)."""
        n = self.local_parts[part]
        self._store(self._rows(part), take(full, rows=slice(self.tp.rank * n, (self.tp.rank + 1) * n)))

    @torch.no_grad()
    def load_bias(self, part: int, full: torch.Tensor) -> None:
        n = self.local_parts[part]
        self.bias[self._rows(part)].copy_(full[self.tp.rank * n:(self.tp.rank + 1) * n])


class RowParallelLinear(_Linear):
    """y = sum over ranks of x_r W_r^T (+ b): input features split, outputs all-reduced."""

    def __init__(self, in_features: int, out_features: int, bias: bool,
                 tp: TensorParallelGroup = SINGLE) -> None:
        super().__init__()
        self.tp = tp
        self.local_in = tp.shard(in_features, "input features")
        self.weight = nn.Parameter(torch.empty(out_features, self.local_in))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.packed: Packed | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tp.all_reduce(linear(x, self.weight, None, self.packed))
        return y if self.bias is None else y + self.bias

    @torch.no_grad()
    def load_weight(self, part: int, full: torch.Tensor) -> None:
        """Copy this rank's input columns from the full tensor (out, in); `part` must be 0."""
        start = self.tp.rank * self.local_in
        self._store(slice(None), take(full, cols=slice(start, start + self.local_in)))

    @torch.no_grad()
    def load_bias(self, part: int, full: torch.Tensor) -> None:
        self.bias.copy_(full)
