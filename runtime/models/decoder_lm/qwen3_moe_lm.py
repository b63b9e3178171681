"""`qwen3_moe_lm`: Qwen3-MoE decoder LM (Qwen3-Omni thinker), Qwen3 attention and top-k routed experts.

The implementation is the shared `runtime.model_executor.layers.DecoderLM`; see its module docstring
for the forward / KV cache interface.
"""
from __future__ import annotations

from runtime.model_executor.layers import DecoderFamily, DecoderLM


class Qwen3MoeLM(DecoderLM):
    kind = "qwen3_moe_lm"
    family = DecoderFamily(qk_norm=True)
