"""Shared decoder layers: RMSNorm, RoPE, paged self-attention, SwiGLU MLP, sparse MoE, and `DecoderLM`."""
from __future__ import annotations

from runtime.model_executor.layers.config import DecoderConfig, DecoderFamily
from runtime.model_executor.layers.decoder import DecoderLayer, DecoderLM

__all__ = ["DecoderConfig", "DecoderFamily", "DecoderLayer", "DecoderLM"]
