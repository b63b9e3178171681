"""`qwen3_moe_lm`: Qwen3-MoE decoder LM (Qwen3-Omni thinker), Qwen3 attention and top-k routed experts.

The implementation is the shared `runtime.model_executor.layers.DecoderLM`; see its module docstring
for the forward / KV cache interface.
"""
from __future__ import annotations

from runtime.model_executor.components import register
from runtime.model_executor.layers import DecoderFamily, DecoderLM


@register("qwen3_moe_lm")
class Qwen3MoeLM(DecoderLM):
    family = DecoderFamily(qk_norm=True)
