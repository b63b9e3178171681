"""Qwen3-MoE sparse MLP: softmax router, top-k experts per token, SwiGLU experts.

Experts are stored stacked — `experts.gate_up_proj` (E, 2*I, hidden) and
`experts.down_proj` (E, hidden, I) — and loaded from the checkpoint's per-expert
`experts.{e}.gate_proj/up_proj/down_proj` tensors. Under tensor parallelism each rank
holds a slice I/tp of every expert's intermediate channels and the output is all-reduced.
Tokens are grouped by expert so each active expert runs one GEMM pair. Told `quant_as_loaded(scheme)`
while built, each expert's two weights are quantized as they load (runtime.model_executor.parallel.quant).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.model_executor.layers.config import DecoderConfig
from runtime.model_executor.parallel import TensorParallelGroup
from runtime.model_executor.parallel.cpu_linear import Packed, dense_gone, linear, pack_weight
from runtime.model_executor.parallel.quant import Assembly, check_shape, take
from runtime.model_executor.weights import Slot
from runtime.model_executor.weights.slots import placeholders_loading


class SparseMoE(nn.Module):
    def __init__(self, config: DecoderConfig, tp: TensorParallelGroup) -> None:
        super().__init__()
        e, h = config.num_experts, config.hidden_size
        self.tp, self.top_k, self.norm_topk_prob = tp, config.num_experts_per_tok, config.norm_topk_prob
        self.full_intermediate = config.moe_intermediate_size
        self.local_intermediate = tp.shard(config.moe_intermediate_size, "moe_intermediate_size")
        self.gate = nn.Linear(h, e, bias=False)
        self.experts = nn.Module()
        self.experts.gate_up_proj = nn.Parameter(torch.empty(e, 2 * self.local_intermediate, h))
        self.experts.down_proj = nn.Parameter(torch.empty(e, h, self.local_intermediate))
        self.packed: list[list[Packed | None]] | None = None  # per expert (runtime.model_executor.parallel.cpu_linear)
        self.quant = ""                                         # the scheme its experts quantize by as they load
        self.assemblies: dict[tuple[int, int], Assembly] = {}  # (expert, 0: gate_up | 1: down) -> rows so far

    def pack_for_cpu(self) -> int:
        """Each expert's two weights packed; the dense ones then go (runtime.model_executor.parallel.cpu_linear)."""
        if self.experts.gate_up_proj.device.type == "meta":     # packed already
            return 0
        packs = [[pack_weight(gate_up), pack_weight(down)]
                 for gate_up, down in zip(self.experts.gate_up_proj, self.experts.down_proj)]
        self.packed = packs if all(p is not None for pair in packs for p in pair) else None
        if self.packed:
            self.experts.gate_up_proj = dense_gone(self.experts.gate_up_proj)
            self.experts.down_proj = dense_gone(self.experts.down_proj)
        return 2 * len(packs) if self.packed else 0

    def quant_as_loaded(self, scheme: str) -> None:
        """Quantize every expert's weights by `scheme` as they load; the dense ones go now (module doc)."""
        for weight in (self.experts.gate_up_proj, self.experts.down_proj):
            check_shape(scheme, *weight.shape[1:])
        self.quant = scheme
        self.packed = [[None, None] for _ in range(self.experts.gate_up_proj.shape[0])]
        self.experts.gate_up_proj = dense_gone(self.experts.gate_up_proj)
        self.experts.down_proj = dense_gone(self.experts.down_proj)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, k) routing weights in x's dtype and (N, k) expert ids."""
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = self.route(x)
        flat = experts.flatten()                               # (N*k,) expert of each (token, choice)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.gate.out_features).tolist()
        out = torch.zeros_like(x)
        start = 0
        for e, count in enumerate(counts):
            if count:
                picks = order[start:start + count]
                tokens = picks // self.top_k
                packed = self.packed[e] if self.packed else (None, None)
                gate, up = linear(x[tokens], self.experts.gate_up_proj[e], None, packed[0]).chunk(2, dim=-1)
                y = linear(F.silu(gate) * up, self.experts.down_proj[e], None, packed[1])   # (count, hidden)
                out.index_add_(0, tokens, y * weights.flatten()[picks, None])
                start += count
        return self.tp.all_reduce(out)

    @torch.no_grad()
    def _load(self, e: int, name: str, full: torch.Tensor) -> None:
        i, r = self.local_intermediate, self.tp.rank
        if name == "down_proj":
            which, rows, part = 1, slice(None), take(full, cols=slice(r * i, (r + 1) * i))
        else:
            which, part = 0, take(full, rows=slice(r * i, (r + 1) * i))
            rows = slice(0, i) if name == "gate_proj" else slice(i, 2 * i)
        weight = (self.experts.gate_up_proj, self.experts.down_proj)[which]
        if not self.quant:
            weight[e, rows].copy_(part)
        elif not placeholders_loading():
            if (e, which) not in self.assemblies:
                self.assemblies[e, which] = Assembly(*weight.shape[1:], self.quant, weight.dtype)
            if (done := self.assemblies[e, which].put(rows, part)) is not None:
                self.packed[e][which] = done
                del self.assemblies[e, which]

    def slots(self, prefix: str) -> dict[str, Slot]:
        h, i = self.gate.in_features, self.full_intermediate
        slots = {f"{prefix}gate.weight": Slot((self.gate.out_features, h), self._load_gate)}
        for e in range(self.gate.out_features):
            for name, shape in (("gate_proj", (i, h)), ("up_proj", (i, h)), ("down_proj", (h, i))):
                slots[f"{prefix}experts.{e}.{name}.weight"] = Slot(shape, lambda t, e=e, n=name: self._load(e, n, t))
        return slots

    @torch.no_grad()
    def _load_gate(self, full: torch.Tensor) -> None:
        self.gate.weight.copy_(full)
