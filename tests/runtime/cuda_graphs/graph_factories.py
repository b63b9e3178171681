"""Factories for the CUDA-graph tests: a tiny LM with prefilled requests in a fragmented paged
cache, the unpadded eager decode step (the reference), and a KV-cache diff by slot."""
from __future__ import annotations

from typing import Sequence

import torch

from mstar_compiler.catalogue import load_catalogue
from runtime.model_executor.components import component_class
from runtime.model_executor.kv import KVBlockManager, PagedKVCache
from runtime.model_executor.layers import DecoderLM

BLOCK = 16                   # the triton kernels need a power of two >= 16
NUM_BLOCKS = 24
PROMPTS = (15, 17, 32)       # prompt lengths: the next decode tokens fill or open a block


def tiny_llama(backend: str, device: str = "cpu", dtype: torch.dtype = torch.float32) -> DecoderLM:
    dims = load_catalogue()["llama_lm"].presets["tiny"]
    torch.manual_seed(0)
    return component_class("llama_lm")(dims, {"seed": 0, "attention_backend": backend}).to(device, dtype).eval()


def prefilled(model: DecoderLM, device: str = "cpu") -> tuple[KVBlockManager, PagedKVCache]:
    """Requests 0..2 with PROMPTS tokens each, their blocks interleaved (allocated round-robin)."""
    manager = KVBlockManager(NUM_BLOCKS, BLOCK)
    cache = model.make_kv_cache(NUM_BLOCKS, BLOCK)
    gen = torch.Generator().manual_seed(1)
    for r in range(len(PROMPTS)):
        manager.allocate(r, 0)
    while any(manager.num_tokens(r) < n for r, n in enumerate(PROMPTS)):
        for r, n in enumerate(PROMPTS):
            manager.append(r, min(BLOCK, n - manager.num_tokens(r)))
    ids = torch.randint(0, model.config.vocab_size, (sum(PROMPTS),), generator=gen).to(device)
    positions = torch.cat([torch.arange(n) for n in PROMPTS]).to(device)
    with torch.inference_mode():   # the cache itself stays a normal tensor, as a worker's does
        model(ids, positions, manager.metadata(list(enumerate(PROMPTS)), device=device), cache)
    return manager, cache


def clone_cache(model: DecoderLM, cache: PagedKVCache) -> PagedKVCache:
    copy = model.make_kv_cache(cache.num_blocks, cache.block_size)
    for dst, src in zip((*copy.k, *copy.v), (*cache.k, *cache.v)):
        dst.copy_(src)
    return copy


@torch.inference_mode()
def eager_decode(model: DecoderLM, manager: KVBlockManager, cache: PagedKVCache, reqs: Sequence[int],
                 tokens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The unpadded decode step of `reqs` (already appended): logits (B, V), hidden (B, H)."""
    device = cache.k[0].device
    batch = manager.metadata([(r, 1) for r in reqs], device=device)
    positions = torch.tensor([manager.num_tokens(r) - 1 for r in reqs], device=device)
    hidden = model(torch.tensor(list(tokens), device=device), positions, batch, cache)
    return model.compute_logits(hidden), hidden


def changed_slots(before: PagedKVCache, after: PagedKVCache) -> set[int]:
    """Flat slots whose key or value differs in any layer."""
    changed = torch.zeros(before.k[0].shape[0] * before.block_size, dtype=torch.bool, device=before.k[0].device)
    for old, new in zip((*before.k, *before.v), (*after.k, *after.v)):
        changed |= (old != new).flatten(2).any(-1).flatten()
    return set(torch.nonzero(changed).flatten().tolist())


def real_blocks(cache: PagedKVCache) -> list[torch.Tensor]:
    """Every layer's K and V without the padding block."""
    return [t[:cache.num_blocks] for t in (*cache.k, *cache.v)]


def new_slot(manager: KVBlockManager, req: int) -> int:
    table = manager.table(req)
    position = table.num_tokens - 1
    return table.blocks[position // BLOCK] * BLOCK + position % BLOCK
