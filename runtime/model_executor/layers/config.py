"""`DecoderConfig`: the dims of a decoder LM preset plus its family's fixed traits, checked once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from mstar_compiler.catalogue.decoder_lm import head_dim, is_sparse_layer


@dataclass(frozen=True)
class DecoderFamily:
    """What a kind fixes regardless of dims (see mstar_compiler/catalogue/decoder_lm.py)."""

    qkv_bias: bool = False    # q, k and v always carry a bias (Qwen2)
    qk_norm: bool = False     # per-head RMSNorm of q and k before RoPE (Qwen3)


@dataclass(frozen=True)
class DecoderConfig:
    hidden_size: int
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float
    rope_scaling: Mapping[str, Any] | None
    rms_norm_eps: float
    tie_word_embeddings: bool
    qkv_bias: bool                 # bias on q, k, v
    o_bias: bool                   # bias on the output projection
    mlp_bias: bool
    qk_norm: bool
    num_experts: int               # 0: dense MLP everywhere
    num_experts_per_tok: int
    moe_intermediate_size: int
    norm_topk_prob: bool
    sparse_layers: tuple[bool, ...]  # per layer: sparse-MoE MLP?

    @classmethod
    def from_dims(cls, dims: Mapping[str, Any], family: DecoderFamily) -> DecoderConfig:
        bias = bool(dims.get("attention_bias", False))
        config = cls(
            hidden_size=dims["hidden_size"], num_layers=dims["num_hidden_layers"],
            num_q_heads=dims["num_attention_heads"], num_kv_heads=dims["num_key_value_heads"],
            head_dim=head_dim(dims), intermediate_size=dims["intermediate_size"],
            vocab_size=dims["vocab_size"], rope_theta=float(dims.get("rope_theta", 10000.0)),
            rope_scaling=dims.get("rope_scaling"), rms_norm_eps=float(dims.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(dims.get("tie_word_embeddings", False)),
            qkv_bias=family.qkv_bias or bias, o_bias=bias, mlp_bias=bool(dims.get("mlp_bias", False)),
            qk_norm=family.qk_norm, num_experts=int(dims.get("num_experts", 0)),
            num_experts_per_tok=int(dims.get("num_experts_per_tok", 0)),
            moe_intermediate_size=int(dims.get("moe_intermediate_size", 0)),
            norm_topk_prob=bool(dims.get("norm_topk_prob", False)),
            sparse_layers=tuple(is_sparse_layer(dims, i) for i in range(dims["num_hidden_layers"])),
        )
        config.check()
        return config

    def check(self) -> None:
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads={self.num_q_heads} is not a multiple of "
                             f"num_key_value_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if any(self.sparse_layers) and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok} must be in "
                             f"[1, num_experts={self.num_experts}]")
