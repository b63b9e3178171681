"""A worker's copy of the block tables (BlockTables) stays the conductor's (KVPoolLedger) when it
takes only what each Run is told: fed random admissions sharing prefixes, later prompt chunks that
continue in cached blocks, decode rows (the steady row's one-call way and the general one),
preemptions and frees, the two hold the same blocks and rows for every request after every Run."""
from __future__ import annotations

import random

import msgspec
import pytest

from runtime.conductor.kv_ledger import KVPoolLedger
from runtime.model_executor.kv import BlockTables
from runtime.transport.messages import WorkItem

BS = 4


class NoCopies:
    """The cache tensors: a pool the conductor owns never forks a table, so no Run carries a copy."""

    def copy_blocks(self, copies) -> None:
        assert not copies, copies


def _run(pool: KVPoolLedger, worker: BlockTables, rid: int, tokens: list[int], steady: bool = False) -> bool:
    """Place one Run as the scheduler does and hand it to the worker's tables; False if it did not fit."""
    item = WorkItem(request_id=rid, tokens=tokens)
    if not (steady and len(tokens) == 1 and pool.place_row(rid, tokens, item)):
        cached = pool.try_grow(rid, len(tokens), tokens)
        if cached is None:
            return False
        item.cached = cached
        pool.tell(rid, item)
    pool.commit()
    item = msgspec.msgpack.decode(msgspec.msgpack.encode(item), type=WorkItem)   # as it crosses the wire
    worker.take(rid, item.kv_at, item.kv_blocks, item.kv_copies, NoCopies())
    worker.grow(rid, len(tokens))
    return True


@pytest.mark.parametrize("root", [b"model", None])
def test_the_workers_tables_are_the_conductors_after_every_run(root) -> None:
    rng = random.Random(7)
    pool, worker = KVPoolLedger(40, BS, root), BlockTables(40, BS)
    prefixes = [[rng.randrange(30) for _ in range(rng.randrange(3, 13))] for _ in range(4)]
    live: dict[int, list[int]] = {}
    told_in_place = 0
    for rid in range(3000):
        op = rng.random()
        if op < 0.2 or not live:
            prompt = rng.choice(prefixes) + [rng.randrange(30) for _ in range(rng.randrange(1, 6))]
            chunk = prompt[:rng.randrange(1, len(prompt) + 1)]
            if _run(pool, worker, rid, chunk):
                live[rid] = prompt[len(chunk):]         # the rest of its prompt, a later chunk
        elif op < 0.3:
            req = rng.choice(list(live))
            rest, live[req] = live[req], []
            if rest and not _run(pool, worker, req, rest):
                live[req] = rest
        elif op < 0.85:
            req = rng.choice(list(live))
            before = pool.tables.get(req).told
            if _run(pool, worker, req, [rng.randrange(30)], steady=rng.random() < 0.7):
                told_in_place += pool.tables.get(req).told == before
        else:                                           # finished or preempted: both let go
            req = rng.choice(list(live))
            del live[req]
            pool.free(req)
            worker.free(req)
        for req in live:
            mine, theirs = pool.tables.table(req), worker.table(req)
            assert (theirs.blocks, theirs.num_tokens) == (mine.blocks, mine.num_tokens), req
        assert worker.used_blocks() == pool.used_blocks
    assert told_in_place > 500                          # decode rows that changed no table
    if root is not None:
        assert pool.stats.hits > 50                     # prompts reused cached blocks, told as table changes


def test_a_run_told_blocks_outside_the_pool_is_refused() -> None:
    worker = BlockTables(8, BS)
    with pytest.raises(ValueError, match="does not fit a table of 0 blocks in a pool of 8"):
        worker.take(1, 0, [3, 8], [], NoCopies())
    with pytest.raises(ValueError, match="from index 2"):
        worker.take(2, 2, [1], [], NoCopies())
