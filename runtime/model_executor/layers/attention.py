"""Decoder self-attention: fused QKV projection, optional q/k norm, RoPE, paged attention, output projection.

HF checkpoints store q_proj, k_proj and v_proj separately; this module keeps them as one
column-parallel `qkv_proj` (one GEMM) and fuses on load. Under tensor parallelism each
rank owns num_heads / tp query heads and num_kv_heads / tp kv heads.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from runtime.model_executor.attention import AttentionBackend, AttentionMetadata
from runtime.model_executor.kv import PagedKVCache
from runtime.model_executor.kernels import cpu as cpu_kernels
from runtime.model_executor.layers.config import DecoderConfig
from runtime.model_executor.layers.norm import RMSNorm
from runtime.model_executor.layers.rotary import RotaryEmbedding, rotate
from runtime.model_executor.parallel import ColumnParallelLinear, RowParallelLinear, TensorParallelGroup
from runtime.model_executor.weights import Slot


@dataclass(frozen=True)
class BatchContext:
    """What every layer of one forward shares."""

    positions: torch.Tensor         # (N,) position of each token row
    batch: AttentionMetadata
    kv_cache: PagedKVCache
    backend: AttentionBackend
    # RotaryEmbedding.cos_sin(positions): (cos, sin), each (N, 1, D), computed once per forward;
    # None: each layer computes them from `positions` with its own rotary module
    rope: tuple[torch.Tensor, torch.Tensor] | None = None
    # the forward runs the fused CPU kernels (runtime/model_executor/kernels/cpu.py), decided once for every layer
    fused: bool = False


class DecoderAttention(nn.Module):
    def __init__(self, config: DecoderConfig, layer: int, rotary: RotaryEmbedding, tp: TensorParallelGroup) -> None:
        super().__init__()
        d = config.head_dim
        self.layer = layer
        self.head_dim = d
        self.num_q_heads = tp.shard(config.num_q_heads, "num_attention_heads")
        self.num_kv_heads = tp.shard(config.num_kv_heads, "num_key_value_heads")
        self.scale = d ** -0.5
        self.qkv_proj = ColumnParallelLinear(
            config.hidden_size, [config.num_q_heads * d, config.num_kv_heads * d, config.num_kv_heads * d],
            bias=config.qkv_bias, tp=tp)
        self.o_proj = RowParallelLinear(config.num_q_heads * d, config.hidden_size, bias=config.o_bias, tp=tp)
        self.q_norm = RMSNorm(d, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(d, config.rms_norm_eps) if config.qk_norm else None
        self._rotary = [rotary]  # shared by all layers; a list keeps it out of the module tree

    def project(self, hidden: torch.Tensor, positions: torch.Tensor,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                rotate_qk: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (N, Hq, D), k and v (N, Hkv, D) for the rows of `hidden` (N, hidden), RoPE applied
        (with the forward's shared `rope` cos/sin when given) unless not `rotate_qk`."""
        n, d = hidden.shape[0], self.head_dim
        q, k, v = self.qkv_proj(hidden).split(
            [self.num_q_heads * d, self.num_kv_heads * d, self.num_kv_heads * d], dim=-1)
        q, k, v = q.view(n, self.num_q_heads, d), k.view(n, self.num_kv_heads, d), v.view(n, self.num_kv_heads, d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if not rotate_qk:
            return q, k, v
        if rope is None:
            q, k = self._rotary[0](positions, q, k)
        else:
            q, k = rotate(q, *rope), rotate(k, *rope)
        return q, k, v

    def forward(self, hidden: torch.Tensor, ctx: BatchContext) -> torch.Tensor:
        if self._fuses_rope(hidden, ctx):
            q, k, v = self.project(hidden, ctx.positions, None, rotate_qk=False)
            cpu_kernels.rope_cache(q, k, v, *ctx.rope, ctx.batch.slot_mapping, ctx.kv_cache.k[self.layer],
                                   ctx.kv_cache.v[self.layer])
        else:
            q, k, v = self.project(hidden, ctx.positions, ctx.rope)
            ctx.kv_cache.write(self.layer, k, v, ctx.batch.slot_mapping)
        out = ctx.backend.attend(q, ctx.kv_cache.k[self.layer], ctx.kv_cache.v[self.layer], ctx.batch, self.scale)
        return self.o_proj(out.reshape(hidden.shape[0], self.num_q_heads * self.head_dim))  # (N, hidden)

    def _fuses_rope(self, hidden: torch.Tensor, ctx: BatchContext) -> bool:
        """RoPE and the KV write as one CPU kernel call (runtime/model_executor/kernels/cpu.py)."""
        return (ctx.fused and ctx.rope is not None and ctx.kv_cache.dtype == hidden.dtype
                and cpu_kernels.heads_fit(self.head_dim))

    def slots(self, prefix: str, config: DecoderConfig) -> dict[str, Slot]:
        d, h = config.head_dim, config.hidden_size
        sizes = {"q_proj": config.num_q_heads * d, "k_proj": config.num_kv_heads * d, "v_proj": config.num_kv_heads * d}
        slots = {}
        for part, (name, size) in enumerate(sizes.items()):
            slots[f"{prefix}{name}.weight"] = Slot((size, h), lambda t, p=part: self.qkv_proj.load_weight(p, t))
            if config.qkv_bias:
                slots[f"{prefix}{name}.bias"] = Slot((size,), lambda t, p=part: self.qkv_proj.load_bias(p, t))
        slots[f"{prefix}o_proj.weight"] = Slot((h, config.num_q_heads * d), lambda t: self.o_proj.load_weight(0, t))
        if config.o_bias:
            slots[f"{prefix}o_proj.bias"] = Slot((h,), lambda t: self.o_proj.load_bias(0, t))
        if config.qk_norm:
            slots[f"{prefix}q_norm.weight"] = Slot((d,), lambda t: self.q_norm.load_weight(0, t), is_norm=True)
            slots[f"{prefix}k_norm.weight"] = Slot((d,), lambda t: self.k_norm.load_weight(0, t), is_norm=True)
        return slots
