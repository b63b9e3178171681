"""One node executor driven in this process, its KV block tables owned as the conductor owns them.

Tests, benchmarks and profilers that call an executor directly (no conductor, no worker) still need
the tables a served node's Runs are told: `LocalRun` grows each Run's table in a `KVPoolLedger`
(runtime/conductor/kv_ledger.py), with prefix reuse where the executor names a prefix root, tells
the item (`WorkItem.kv_at` / `kv_blocks` / `kv_copies`, `cached`), keys the full blocks and runs the
executor; a Run that raises un-keys what it was to write, as a failed batch does when served. A Run
whose tokens are a media item's placeholders is keyed by that item as the scheduler keys it
(runtime/conductor/media_keys.py) when given the item (`media`).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from runtime.conductor.kv_ledger import KVPoolLedger
from runtime.conductor.media_keys import run_rows
from runtime.conductor.request import MediaInput
from runtime.transport.messages import WorkItem
from runtime.transport.request_params import RequestParams


class LocalRun:
    """An executor with a KV pool, and the conductor's tables for it."""

    def __init__(self, executor: Any, prefix_cache: bool = True) -> None:
        root = bytes.fromhex(executor.kv_prefix_key) if prefix_cache and executor.kv_prefix_key else None
        self.executor = executor
        self.pool = KVPoolLedger(executor.kv_blocks, executor.kv_block_size, root,
                                 frozenset(executor.kv_prefix_stop_ids), frozenset(executor.kv_media_ids))

    def open(self, request_id: int, params: RequestParams) -> None:
        self.executor.open(request_id, params)

    def run(self, items: Sequence[WorkItem], inputs: Sequence[dict[str, torch.Tensor]],
            media: Sequence[MediaInput | None] = ()) -> list:
        """Grow and tell each item's table (OutOfBlocks if the pool is full), then run the batch;
        `media`: per item, the media input item its tokens stand for (None: text)."""
        items = list(items)
        for i, item in enumerate(items):
            rows = run_rows(item.tokens, media[i] if i < len(media) else None, self.pool.media_ids)
            item.cached = self.pool.grow(item.request_id, len(item.tokens), rows)
            self.pool.tell(item.request_id, item)
        self.pool.commit()
        try:
            return self.executor.run(items, list(inputs))
        except BaseException:
            self.pool.forget([item.request_id for item in items])
            raise

    def close(self, request_id: int, kv_only: bool = False) -> None:
        self.pool.free(request_id)
        self.executor.close(request_id, kv_only)


__all__ = ["LocalRun"]
