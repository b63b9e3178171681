"""zimage_text_encoder: Z-Image's prompt encoder, a Qwen3 LM read for hidden states (no decoding).

A request's prompt tokens -> the rows its next-to-last layer writes (transformers' `hidden_states[-2]`:
the embeddings through every layer but the last, no final norm), what diffusers' ZImagePipeline hands
its DiT. So the module holds `num_hidden_layers - 1` layers; the checkpoint's last layer and final
norm are checked for shape and dropped on load (`hf_slots`). One call encodes a batch of prompts of any
lengths: causal attention, each row at its own position 0.. n-1, shorter prompts padded on the right
(a padding row is never attended to by a real one). Parameter names follow transformers' `Qwen3Model`
(`embed_tokens`, `layers.N.self_attn.q_proj`, `q_norm`, `mlp.gate_proj`, ...) so the published
`text_encoder/` loads as is; written here from its definition.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from runtime.model_executor.layers.norm import RMSNorm
from runtime.model_executor.layers.rotary import RotaryEmbedding, rotate
from runtime.model_executor.weights import Slot
from runtime.model_executor.weights.fill import fill_weights
from runtime.model_executor.weights.slots import parameter_slots


class _Attention(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        h, hd = d["hidden_size"], d["head_dim"]
        self.heads, self.kv_heads = d["num_attention_heads"], d["num_key_value_heads"]
        self.q_proj = nn.Linear(h, self.heads * hd, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.heads * hd, h, bias=False)
        self.q_norm, self.k_norm = RMSNorm(hd, d["rms_norm_eps"]), RMSNorm(hd, d["rms_norm_eps"])

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q = rotate(self.q_norm(self.q_proj(x).view(b * n, self.heads, -1)), cos, sin)
        k = rotate(self.k_norm(self.k_proj(x).view(b * n, self.kv_heads, -1)), cos, sin)
        v = self.v_proj(x).view(b * n, self.kv_heads, -1)
        q, k, v = (t.view(b, n, t.shape[1], -1).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.kv_heads != self.heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class _MLP(nn.Module):
    def __init__(self, h: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(h, inter, bias=False)
        self.up_proj = nn.Linear(h, inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        self.self_attn = _Attention(d)
        self.mlp = _MLP(d["hidden_size"], d["intermediate_size"])
        self.input_layernorm = RMSNorm(d["hidden_size"], d["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(d["hidden_size"], d["rms_norm_eps"])

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class ZImageTextEncoder(nn.Module):
    """Prompt tokens -> caption rows (module docstring)."""
    kind = "zimage_text_encoder"

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        args = dict(args or {})
        self.dims = dict(dims)
        self.embed_tokens = nn.Embedding(dims["vocab_size"], dims["hidden_size"])
        self.layers = nn.ModuleList(_Layer(dims) for _ in range(dims["num_hidden_layers"] - 1))
        self.rotary = RotaryEmbedding(dims["head_dim"], float(dims["rope_theta"]))
        fill_weights(self, args, self.hf_slots())

    def hf_slots(self) -> dict[str, Slot]:
        """Every tensor of the published checkpoint: the kept ones, and the last layer's and the final norm's,
        checked for shape and dropped (the encoder reads the next-to-last layer's output)."""
        slots = parameter_slots(self)
        last = len(self.layers)
        for name, slot in list(slots.items()):
            if name.startswith("layers.0."):
                slots[f"layers.{last}." + name[len("layers.0."):]] = Slot(slot.shape, _drop, slot.is_norm)
        slots["norm.weight"] = Slot((self.dims["hidden_size"],), _drop, is_norm=True)
        return slots

    @torch.inference_mode()
    def forward(self, prompts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """prompts: (T_i,) int64 token ids each -> (T_i, hidden_size) rows each."""
        longest = max(int(p.numel()) for p in prompts)
        device = self.embed_tokens.weight.device
        ids = torch.zeros(len(prompts), longest, dtype=torch.long, device=device)
        for b, p in enumerate(prompts):
            ids[b, :p.numel()] = p.to(device)
        x = self.embed_tokens(ids)
        positions = torch.arange(longest, device=device).repeat(len(prompts))
        cos, sin = self.rotary.cos_sin(positions, x.dtype)
        mask = torch.ones(longest, longest, dtype=torch.bool, device=device).tril()
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return [x[b, :p.numel()] for b, p in enumerate(prompts)]


def _drop(tensor: torch.Tensor) -> None:
    """A published tensor the encoder does not read (its shape was checked)."""
