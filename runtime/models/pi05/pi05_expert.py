"""pi05_expert: one flow-matching step of π0.5's action expert over a batch of requests.

Each request brings its prefix's keys and values (`pi05_prefix`'s rows), its action chunk x (chunk,
max_action_dim) and its time t (1: noise). The chunk's rows are `action_in_proj(x)`; the time becomes a
sinusoidal embedding (periods from min_period to max_period) through two SiLU linears, and it modulates
every norm of the expert (scale, shift and a residual gate: `AdaptiveRMSNorm`). In each layer the chunk's
rows attend to the prefix's keys and values of the same layer and, both ways, to each other, at positions
after the prefix's; the last norm and `action_out_proj` give the velocity (chunk, max_action_dim). Requests
with prefixes of different lengths share a call, padded under a key mask. Parameter names follow
transformers' `PI05ForConditionalGeneration` (`dit.layers.N...` for its `model.dit`, `embed_action_time.*`,
`action_out_proj`); written here from its definition.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from runtime.models.pi05.gemma import AdaptiveRMSNorm, GemmaMLP, GemmaProjections, attend, rope_tables
from runtime.model_executor.layers.rotary import RotaryEmbedding
from runtime.model_executor.parallel.cpu_linear import device_of
from runtime.model_executor.weights.fill import fill_weights


class _ExpertLayer(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        h = d["expert_hidden_size"]
        self.self_attn = GemmaProjections(h, d["expert_num_attention_heads"], d["num_key_value_heads"], d["head_dim"])
        self.mlp = GemmaMLP(h, d["expert_intermediate_size"])
        self.input_layernorm = AdaptiveRMSNorm(h, d["rms_norm_eps"])
        self.post_attention_layernorm = AdaptiveRMSNorm(h, d["rms_norm_eps"])


class _Dit(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_ExpertLayer(d) for _ in range(d["num_hidden_layers"]))
        self.norm = AdaptiveRMSNorm(d["expert_hidden_size"], d["rms_norm_eps"])


class _ActionTime(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        h = d["expert_hidden_size"]
        self.action_in_proj = nn.Linear(d["max_action_dim"], h)
        self.time_mlp_in = nn.Linear(h, h)
        self.time_mlp_out = nn.Linear(h, h)
        fraction = torch.linspace(0.0, 1.0, h // 2, dtype=torch.float32)
        period = d["min_period"] * (d["max_period"] / d["min_period"]) ** fraction
        self.register_buffer("frequencies", 1.0 / period * 2 * math.pi, persistent=False)

    def forward(self, actions: torch.Tensor, time: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.action_in_proj(actions)
        angles = self.frequencies[None, :] * time.float()[:, None]
        embeds = torch.cat([angles.sin(), angles.cos()], dim=1).to(rows.dtype)
        return rows, F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(embeds))))


class Pi05Expert(nn.Module):
    """Prefix keys and values + action chunk + time -> the chunk's velocity (module docstring)."""
    kind = "pi05_expert"

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.kv_width = int(dims["num_key_value_heads"]) * int(dims["head_dim"])
        self.kv_heads = int(dims["num_key_value_heads"])
        self.dit = _Dit(dims)
        self.embed_action_time = _ActionTime(dims)
        self.action_out_proj = nn.Linear(dims["expert_hidden_size"], dims["max_action_dim"])
        self.rotary = RotaryEmbedding(dims["head_dim"], float(dims["rope_theta"]))
        fill_weights(self, dict(args or {}))

    @staticmethod
    def _prefix(prefixes: Sequence[torch.Tensor], dtype: torch.dtype) -> tuple[torch.Tensor, list[int]]:
        """The prefixes padded to one (B, S, kv_row_width) tensor, and their lengths."""
        lengths = [int(p.shape[0]) for p in prefixes]
        padded = nn.utils.rnn.pad_sequence([p.to(dtype) for p in prefixes], batch_first=True)
        return padded, lengths

    @torch.inference_mode()
    def forward(self, prefixes: Sequence[torch.Tensor], actions: Sequence[torch.Tensor], time: torch.Tensor
                ) -> list[torch.Tensor]:
        """prefixes (T_i, kv_row_width), actions (chunk, max_action_dim), time (B,) -> velocities (chunk, A)."""
        device, dtype = device_of(self), self.action_out_proj.weight.dtype
        x, t_emb = self.embed_action_time(torch.stack([a.to(device, dtype) for a in actions]), time.to(device))
        batch, chunk = x.shape[0], x.shape[1]
        prefix, lengths = self._prefix([p.to(device) for p in prefixes], dtype)
        longest = prefix.shape[1]
        key_mask = None
        if any(n != longest for n in lengths):
            real = torch.arange(longest, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]
            key_mask = torch.cat([real, torch.ones(batch, chunk, dtype=torch.bool, device=device)], dim=1)
        positions = torch.tensor(lengths, device=device)[:, None] + torch.arange(chunk, device=device)[None, :]
        cos, sin = rope_tables(self.rotary, positions, dtype)
        layer_kv = prefix.view(batch, longest, len(self.dit.layers), 2, self.kv_heads, -1)
        for i, layer in enumerate(self.dit.layers):
            normed, gate = layer.input_layernorm(x, t_emb)
            q, k, v = layer.self_attn.qkv(normed, cos, sin)
            keys = torch.cat([layer_kv[:, :, i, 0].transpose(1, 2), k], dim=2)
            values = torch.cat([layer_kv[:, :, i, 1].transpose(1, 2), v], dim=2)
            x = x + gate * layer.self_attn.out(attend(q, keys, values, key_mask))
            normed, gate = layer.post_attention_layernorm(x, t_emb)
            x = x + gate * layer.mlp(normed)
        normed, _ = self.dit.norm(x, t_emb)
        return list(self.action_out_proj(normed).unbind(0))
