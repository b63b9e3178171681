"""SmolLM2 test helpers: build mstar's llama_lm from the GGUF, and a small batched generate loop.

The loop is what a worker and conductor do for plain text generation, in one process:
prefill every prompt in one packed forward, then decode all unfinished requests together,
sampling with per-request `SamplingState`s and streaming text through `TextOutput`s.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from runtime.model_executor.components import component_class
from runtime.model_executor.kv import KVBlockManager
from runtime.model_executor.layers import DecoderLM
from runtime.model_executor.sampling import Sampler, SamplingParams, SamplingState
from runtime.text import TextOutput, TextTokenizer
from runtime.model_executor.weights.gguf_loader import GGUFCheckpoint


def build_llama_lm(ckpt: GGUFCheckpoint) -> DecoderLM:
    model = component_class("llama_lm")(ckpt.config(), {"seed": 0, "attention_backend": "torch"})
    model.load_hf_state_dict(ckpt.iter_state_dict(torch.float32))
    return model.eval()


@dataclass
class Generation:
    """One request's result."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    stop_reason: int | str | None = None


@torch.no_grad()
def generate(model: DecoderLM, tokenizer: TextTokenizer, prompts: Sequence[list[int]],
             params: Sequence[SamplingParams], max_new_tokens: int, block_size: int = 16) -> list[Generation]:
    """Generate for every prompt in one continuous batch until it stops or hits max_new_tokens."""
    num_blocks = len(prompts) * (-(-(max(map(len, prompts)) + max_new_tokens) // block_size))
    manager, cache = KVBlockManager(num_blocks, block_size), model.make_kv_cache(num_blocks, block_size)
    states = [SamplingState(p, prompt) for p, prompt in zip(params, prompts)]
    streams = [TextOutput(tokenizer, p, prompt) for p, prompt in zip(params, prompts)]
    results = [Generation() for _ in prompts]
    pending = {i: list(prompt) for i, prompt in enumerate(prompts)}    # request -> tokens to feed next
    sampler = Sampler()
    while pending:
        rows = list(pending)
        logits = _forward(model, manager, cache, [(i, pending[i]) for i in rows])
        tokens = sampler(logits, [states[i] for i in rows]).token_ids.tolist()
        for i, token in zip(rows, tokens):
            states[i].append(token)
            results[i].token_ids.append(token)
            delta = streams[i].push(token)
            results[i].text += delta.text
            pending[i] = [token]
            if delta.finished or len(results[i].token_ids) == max_new_tokens:
                results[i].stop_reason = delta.stop_reason
                results[i].text += streams[i].finish()
                del pending[i]
    return results


def _forward(model: DecoderLM, manager: KVBlockManager, cache, chunks: list[tuple[int, list[int]]]) -> torch.Tensor:
    """One packed forward over each request's new tokens; next-token logits (B, V)."""
    ids, positions = [], []
    for req, tokens in chunks:
        if req not in manager:
            manager.allocate(req, 0)
        start = manager.num_tokens(req)
        cache.copy_blocks(manager.append(req, len(tokens)))
        ids.extend(tokens)
        positions.extend(range(start, start + len(tokens)))
    batch = manager.metadata([(req, len(tokens)) for req, tokens in chunks])
    hidden = model(torch.tensor(ids), torch.tensor(positions), batch, cache)
    return model.compute_logits(hidden[batch.last_token_rows()])
