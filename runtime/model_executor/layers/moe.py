"""Qwen3-MoE sparse MLP: softmax router, top-k experts per token, SwiGLU experts.

Experts are stored stacked — `experts.gate_up_proj` (E, 2*I, hidden) and
`experts.down_proj` (E, hidden, I) — and loaded from the checkpoint's per-expert
`experts.{e}.gate_proj/up_proj/down_proj` tensors. Under tensor parallelism each rank
holds a slice I/tp of every expert's intermediate channels and the output is all-reduced.
Tokens are grouped by expert so each active expert runs one GEMM pair.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.model_executor.layers.config import DecoderConfig
from runtime.model_executor.parallel import TensorParallelGroup
from runtime.model_executor.parallel.cpu_linear import Packed, dense_gone, linear, pack_weight
from runtime.model_executor.weights import Slot


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
        self.packed: list[tuple[Packed, Packed]] | None = None  # per expert (runtime.model_executor.parallel.cpu_linear)

    def pack_for_cpu(self) -> int:
        """Each expert's two weights packed; the dense ones then go (runtime.model_executor.parallel.cpu_linear)."""
        if self.experts.gate_up_proj.device.type == "meta":     # packed already
            return 0
        packs = [(pack_weight(gate_up), pack_weight(down))
                 for gate_up, down in zip(self.experts.gate_up_proj, self.experts.down_proj)]
        self.packed = packs if all(p is not None for pair in packs for p in pair) else None
        if self.packed:
            self.experts.gate_up_proj = dense_gone(self.experts.gate_up_proj)
            self.experts.down_proj = dense_gone(self.experts.down_proj)
        return 2 * len(packs) if self.packed else 0

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
            self.experts.down_proj[e].copy_(full[:, r * i:(r + 1) * i])
        else:
            rows = slice(0, i) if name == "gate_proj" else slice(i, 2 * i)
            self.experts.gate_up_proj[e, rows].copy_(full[r * i:(r + 1) * i])

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
