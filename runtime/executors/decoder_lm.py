"""Runs a decoder LM node (`runtime.layers.DecoderLM` kinds) over a batch: mixed prefill/decode.

One call packs every request's new tokens (a whole prompt, a recomputed context after
preemption, or one decode token) into one forward over the paged KV cache, then samples
one token per request with that request's own `SamplingState` (seeded per request, so the
batch around a request never changes its tokens). The block tables live here
(`KVBlockManager`); the conductor keeps a matching count and never over-commits.
"""
from __future__ import annotations

from typing import Any

import torch

from mstar_compiler.plan import Node
from runtime.executors import ExecResult
from runtime.kv import KVBlockManager
from runtime.sampling import Sampler, SamplingParams, SamplingState
from runtime.transport.messages import WorkItem

SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                   "presence_penalty", "frequency_penalty", "seed")


def sampling_params(params: dict[str, Any]) -> SamplingParams:
    """The sampling part of a request's params (stops are the conductor's business)."""
    return SamplingParams.from_mapping({k: params[k] for k in SAMPLING_FIELDS if k in params})


class DecoderLMExecutor:
    """A decoder LM node on one rank: model, paged cache, block tables, per-request samplers."""

    def __init__(self, node: Node, model: torch.nn.Module, rank: int) -> None:
        pool = next(p for p in node.kv_pools if p.rank == rank)
        self.node = node
        self.model = model
        self.kv_blocks, self.kv_block_size = pool.num_pages, pool.page_tokens
        self.cache = model.make_kv_cache(pool.num_pages, pool.page_tokens)
        self.blocks = KVBlockManager(pool.num_pages, pool.page_tokens)
        self.sampler = Sampler()
        self._params: dict[int, SamplingParams] = {}
        self._states: dict[int, SamplingState] = {}

    def open(self, request_id: int, params: dict[str, Any]) -> None:
        self._params[request_id] = sampling_params(params)

    def close(self, request_id: int, kv_only: bool) -> None:
        if request_id in self.blocks:
            self.blocks.free(request_id)
        if not kv_only:
            self._params.pop(request_id, None)
            self._states.pop(request_id, None)

    def kv_used_blocks(self) -> int:
        return self.kv_blocks - self.blocks.allocator.num_free

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]:
        starts = [self._reserve(item) for item in items]
        ids = torch.tensor([t for item in items for t in item.tokens], dtype=torch.long)  # (N,)
        positions = torch.cat([torch.arange(s, s + len(item.tokens)) for s, item in zip(starts, items)])
        batch = self.blocks.metadata([(item.request_id, len(item.tokens)) for item in items])
        hidden = self.model(ids, positions, batch, self.cache)                 # (N, hidden)
        logits = self.model.compute_logits(hidden[batch.last_token_rows()])    # (B, vocab)
        states = [self._state(item) for item in items]
        tokens = self.sampler(logits, states).token_ids.tolist()
        results = []
        for b, (item, state, token) in enumerate(zip(items, states, tokens)):
            state.append(token)
            rows = slice(int(batch.query_start_loc[b]), int(batch.query_start_loc[b + 1]))
            results.append(ExecResult([token], {"token": torch.tensor([token]), "hidden": hidden[rows]}))
        return results

    def _reserve(self, item: WorkItem) -> int:
        """Room for the item's tokens in the cache; returns the position of its first token."""
        rid = item.request_id
        if rid not in self.blocks:
            self.blocks.allocate(rid, len(item.tokens))
            return 0
        start = self.blocks.num_tokens(rid)
        for src, dst in self.blocks.append(rid, len(item.tokens)):
            self.cache.copy_blocks([(src, dst)])
        return start

    def _state(self, item: WorkItem) -> SamplingState:
        rid = item.request_id
        if rid not in self._states:
            self._states[rid] = SamplingState(self._params.get(rid, SamplingParams()), item.tokens)
        return self._states[rid]
