"""One node executor driven in this process, its KV block tables owned as the conductor owns them.

Tests, benchmarks and profilers that call an executor directly (no conductor, no worker) still need
the tables a served node's Runs are told: `LocalRun` grows each Run's table in a `KVPoolLedger`
(runtime/conductor/kv_ledger.py), with prefix reuse where the executor names a prefix root, tells
the item (`WorkItem.kv_at` / `kv_blocks` / `kv_copies`, `cached`), keys the full blocks and runs the
executor; a Run that raises un-keys what it was to write, as a failed batch does when served. A Run
whose tokens are a media item's placeholders is keyed by that item as the scheduler keys it
(runtime/conductor/media_keys.py) when given the item (`media`). `LocalGroup` does the same for
executors that share one cache and run their batches as one call (BAGEL's LM nodes on a rank): one
pool of (request, node) tables, each Run's rows laid out by its family's rule (`Family.kv_rows`).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from mstar_compiler.plan import Plan
from runtime.conductor.kv_ledger import BranchPool, KVPoolLedger
from runtime.conductor.media_keys import medium, run_rows
from runtime.conductor.request import MediaInput, SizedInput
from runtime.conductor.scheduler import kv_row_rules
from runtime.model_executor.kv import OutOfBlocks
from runtime.model_executor.kv.run_rows import KVRun
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


def _no_prompt() -> list[int]:
    raise ValueError("LocalGroup is given no request prompt: a family rule that reads one needs the scheduler")


class LocalGroup:
    """Executors sharing one cache and run group (name -> executor), and the conductor's one pool for them."""

    def __init__(self, plan: Plan, executors: Mapping[str, Any], prefix_cache: bool = True) -> None:
        first = next(iter(executors.values()))
        root = bytes.fromhex(first.kv_prefix_key) if prefix_cache and first.kv_prefix_key else None
        self.executors = dict(executors)
        self.pool = KVPoolLedger(sum(ex.kv_blocks for ex in executors.values()), first.kv_block_size, root,
                                 tails=True)
        self.branches = {name: BranchPool(self.pool, name, reports=name == ex.kv_pool)
                         for name, ex in executors.items()}
        self.rules = kv_row_rules(plan)

    def run(self, calls: Sequence[tuple[str, list[WorkItem], list[dict[str, torch.Tensor]]]],
            media: Mapping[int, MediaInput | SizedInput] | None = None) -> list[list]:
        """calls: (node, items, inputs) per batch, run as the worker runs a group's queued batches; `media`:
        request -> the picture its for_each state reads. Grows and tells every item's table first
        (OutOfBlocks if the pool is full)."""
        media = media or {}
        for name, items, _ in calls:
            branch, rule = self.branches[name], self.rules[name]
            for item in items:
                picture = media.get(item.request_id)
                laid = rule(KVRun(item.walk, item.tokens, branch.held(item.request_id), _no_prompt,
                                  None if picture is None else medium(picture)))
                if not laid.count:
                    continue
                cached = branch.try_grow(item.request_id, laid.count, laid.rows, laid.whole)
                if cached is None:
                    raise OutOfBlocks(laid.count, self.pool.free_blocks())
                item.cached, item.kv_rows = cached, laid.count
                branch.tell(item.request_id, item)
        self.pool.commit()
        group = [(self.executors[name], items, inputs) for name, items, inputs in calls]
        try:
            return group[0][0].group.run_group(group)
        except BaseException:
            for name, items, _ in calls:
                self.branches[name].forget([item.request_id for item in items])
            raise

    def close(self, request_id: int, kv_only: bool = False) -> None:
        for name, executor in self.executors.items():
            self.branches[name].free(request_id)
            executor.close(request_id, kv_only)


__all__ = ["LocalGroup", "LocalRun"]
