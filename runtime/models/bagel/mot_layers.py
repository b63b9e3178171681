"""BAGEL's mixture-of-transformers decoder layer, built from the shared decoder layers.

Every layer holds two experts with identical shapes: the understanding expert (text,
ViT rows, image markers) and the generation expert (latent rows), BAGEL's `_moe_gen`
weights. Each row goes through its expert's norms, q/k/v/o projections, q/k norms and
MLP; attention runs once over the joint sequence. The generation expert's weights load
from the checkpoint names with `_moe_gen` appended to the module name
(`self_attn.q_proj_moe_gen.weight`, `mlp_moe_gen.gate_proj.weight`,
`input_layernorm_moe_gen.weight`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from runtime.model_executor.attention import AttentionBackend
from runtime.models.bagel.joint_attention import attend_segments
from runtime.models.bagel.segments import SegmentLayout
from runtime.model_executor.kv import PagedKVCache
from runtime.model_executor.layers.attention import DecoderAttention
from runtime.model_executor.layers.config import DecoderConfig
from runtime.model_executor.layers.mlp import GatedMLP
from runtime.model_executor.layers.norm import RMSNorm
from runtime.model_executor.layers.rotary import RotaryEmbedding
from runtime.model_executor.parallel import SINGLE
from runtime.model_executor.weights import Slot

GEN = "_moe_gen"


@dataclass(frozen=True)
class ExpertRows:
    """Which packed rows use which expert."""

    und: torch.Tensor    # (Nu,) row indices of understanding rows
    gen: torch.Tensor    # (Ng,) row indices of generation (latent) rows
    num_rows: int

    def apply(self, und_fn: Callable, gen_fn: Callable, *xs: torch.Tensor):
        """und_fn on the understanding rows of xs, gen_fn on the others, merged back in row order."""
        if len(self.gen) == 0:
            return und_fn(*xs)
        if len(self.und) == 0:
            return gen_fn(*xs)
        return self._merge(und_fn(*(x[self.und] for x in xs)), gen_fn(*(x[self.gen] for x in xs)))

    def _merge(self, u, g):
        if isinstance(u, tuple):
            return tuple(self._merge(a, b) for a, b in zip(u, g))
        out = u.new_empty((self.num_rows, *u.shape[1:]))
        out[self.und] = u
        out[self.gen] = g
        return out


@dataclass(frozen=True)
class MoTContext:
    """What every layer of one call shares."""

    positions: torch.Tensor            # (N,) RoPE position of each row
    experts: ExpertRows
    layout: SegmentLayout
    kv_cache: PagedKVCache
    backend: AttentionBackend          # planned on layout.causal_metadata when that is set


class MoTLayer(nn.Module):
    def __init__(self, config: DecoderConfig, layer: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.layer = layer
        self.input_layernorm = RMSNorm(h, eps)
        self.input_layernorm_moe_gen = RMSNorm(h, eps)
        self.self_attn = DecoderAttention(config, layer, rotary, SINGLE)
        self.self_attn_moe_gen = DecoderAttention(config, layer, rotary, SINGLE)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.post_attention_layernorm_moe_gen = RMSNorm(h, eps)
        self.mlp = GatedMLP(h, config.intermediate_size, config.mlp_bias, SINGLE)
        self.mlp_moe_gen = GatedMLP(h, config.intermediate_size, config.mlp_bias, SINGLE)

    def forward(self, x: torch.Tensor, ctx: MoTContext) -> torch.Tensor:
        ex = ctx.experts
        normed = ex.apply(self.input_layernorm, self.input_layernorm_moe_gen, x)
        q, k, v = ex.apply(self.self_attn.project, self.self_attn_moe_gen.project, normed, ctx.positions)
        attn = self._attend(q, k, v, ctx).flatten(1)  # (N, Hq * D)
        x = x + ex.apply(self.self_attn.o_proj, self.self_attn_moe_gen.o_proj, attn)
        return x + ex.apply(lambda r: self.mlp(self.post_attention_layernorm(r)),
                            lambda r: self.mlp_moe_gen(self.post_attention_layernorm_moe_gen(r)), x)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: MoTContext) -> torch.Tensor:
        layout, cache = ctx.layout, ctx.kv_cache
        if len(layout.write_rows):
            cache.write(self.layer, k[layout.write_rows], v[layout.write_rows], layout.slot_mapping)
        scale = self.self_attn.scale
        if layout.causal_metadata is not None:
            return ctx.backend.attend(q, cache.k[self.layer], cache.v[self.layer], layout.causal_metadata, scale)
        return attend_segments(q, k, v, cache.k[self.layer], cache.v[self.layer], layout, scale)

    def slots(self, prefix: str, config: DecoderConfig) -> dict[str, Slot]:
        """Checkpoint names of both experts' tensors."""
        slots = self.self_attn.slots(f"{prefix}self_attn.", config)
        slots.update(self.mlp.slots(f"{prefix}mlp."))
        for name, slot in self.self_attn_moe_gen.slots(f"{prefix}self_attn.", config).items():
            module, _, param = name.rpartition(".")
            slots[f"{module}{GEN}.{param}"] = slot
        slots.update(self.mlp_moe_gen.slots(f"{prefix}mlp{GEN}."))
        for norm in ("input_layernorm", "post_attention_layernorm"):
            for suffix in ("", GEN):
                module = getattr(self, norm + suffix)
                slots[f"{prefix}{norm}{suffix}.weight"] = Slot(
                    (config.hidden_size,), lambda t, m=module: m.load_weight(0, t), True)
        return slots
