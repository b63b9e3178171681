"""`llama_lm`: Llama decoder LM (SmolLM2, Orpheus), plain GQA attention.

The implementation is the shared `runtime.layers.DecoderLM`; see its module docstring
for the forward / KV cache interface.
"""
from __future__ import annotations

from runtime.components import register
from runtime.layers import DecoderFamily, DecoderLM


@register("llama_lm")
class LlamaLM(DecoderLM):
    family = DecoderFamily()
