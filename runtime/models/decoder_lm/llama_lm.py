"""`llama_lm`: Llama decoder LM (SmolLM2, Orpheus), plain GQA attention.

The implementation is the shared `runtime.model_executor.layers.DecoderLM`; see its module docstring
for the forward / KV cache interface.
"""
from __future__ import annotations

from runtime.model_executor.layers import DecoderFamily, DecoderLM


class LlamaLM(DecoderLM):
    kind = "llama_lm"
    family = DecoderFamily()
