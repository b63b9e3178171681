"""`qwen2_lm`: Qwen2 decoder LM (BAGEL's backbone), q/k/v carry a bias.

The implementation is the shared `runtime.model_executor.layers.DecoderLM`; see its module docstring
for the forward / KV cache interface.
"""
from __future__ import annotations

from runtime.model_executor.layers import DecoderFamily, DecoderLM


class Qwen2LM(DecoderLM):
    kind = "qwen2_lm"
    family = DecoderFamily(qkv_bias=True)
