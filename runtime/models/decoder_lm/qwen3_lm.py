"""`qwen3_lm`: Qwen3 decoder LM, per-head RMSNorm of q and k before RoPE.

The implementation is the shared `runtime.model_executor.layers.DecoderLM`; see its module docstring
for the forward / KV cache interface.
"""
from __future__ import annotations

from runtime.model_executor.layers import DecoderFamily, DecoderLM


class Qwen3LM(DecoderLM):
    kind = "qwen3_lm"
    family = DecoderFamily(qk_norm=True)
