"""Whole-input reuse (`KVBlockManager.extend`, BAGEL's segments): a randomised run against a
shadow of the cache's contents.

The shadow stores which row each slot holds, as the forward would write it; applying the
manager's copies and writes to it and reading every live sequence back checks that a reused
block (full, or a copied tail) holds exactly that sequence's rows. Each step also checks that
no block leaks, reference counts equal the tables holding a block, and a held block is never
evictable. A forward that fails writes garbage; its request may go on (and commit) and must
still leave nothing of it findable.
"""
from __future__ import annotations

import random

from runtime.model_executor.kv import KVBlockManager, OutOfBlocks, prefix_root

BS, NUM_BLOCKS = 4, 24


def _segment(rng: random.Random, i: int) -> list[bytes]:
    return [b"s" + bytes([i, r]) for r in range(rng.randrange(1, 10))]


def _write(content: dict[int, list], kv: KVBlockManager, req, start: int, rows: list) -> None:
    blocks = kv.table(req).blocks
    for pos, row in enumerate(rows, start=start):
        content.setdefault(blocks[pos // BS], [None] * BS)[pos % BS] = row


def _read(content: dict[int, list], kv: KVBlockManager, req) -> list:
    table = kv.table(req)
    return [content.get(table.blocks[p // BS], [None] * BS)[p % BS] for p in range(table.num_tokens)]


def _check(kv: KVBlockManager, content: dict[int, list], truth: dict) -> None:
    owners: dict[int, int] = {}
    for req in truth:
        for b in kv.table(req).blocks:
            owners[b] = owners.get(b, 0) + 1
        assert _read(content, kv, req) == truth[req], f"sequence {req} reads rows it did not write"
    alloc = kv.allocator
    assert all(alloc.ref_count(b) == owners.get(b, 0) for b in range(NUM_BLOCKS)), "reference counts drifted"
    assert not any(alloc.is_evictable(b) for b in owners), "a held block is evictable"
    assert alloc.num_free + len(owners) == NUM_BLOCKS, "a block leaked"


def _extend(kv, content, truth, req, rows, rng) -> bool:
    """One segment on `req`: reused, or computed (a forward that may fail); False if it did not fit."""
    start = kv.num_tokens(req)
    try:
        reused, copies = kv.extend(req, rows)
    except OutOfBlocks:
        return False
    for src, dst in copies:
        content[dst] = list(content.get(src, [None] * BS))
    if reused:
        truth[req] = truth[req] + rows
        return True
    if rng.random() < 0.1:       # the forward fails half-way: garbage, and the request's blocks never keyed
        _write(content, kv, req, start, [b"garbage"] * len(rows))
        kv.uncache(req)
        truth[req] = truth[req] + [b"garbage"] * len(rows)
        return True
    _write(content, kv, req, start, rows)
    kv.commit(req, tails=True)
    truth[req] = truth[req] + rows
    return True


def test_randomised_extend_fork_free_abort_reads_back_exactly_what_was_written() -> None:
    rng = random.Random(7)
    kv = KVBlockManager(NUM_BLOCKS, BS, prefix_root("test", "extend"))
    segments = [_segment(rng, i) for i in range(6)]
    content: dict[int, list] = {}
    truth: dict[int, list] = {}
    next_id, hits = 0, 0
    for _ in range(1500):
        op = rng.random()
        if op < 0.35 or not truth:
            req, next_id = next_id, next_id + 1
            kv.open(req)
            truth[req] = []
            before = kv.allocator.stats.hit_tokens
            if not _extend(kv, content, truth, req, rng.choice(segments), rng):
                kv.free(req)
                del truth[req]
            hits += kv.allocator.stats.hit_tokens > before
        elif op < 0.7:
            req = rng.choice(list(truth))
            if kv.num_tokens(req) < 40:
                _extend(kv, content, truth, req, rng.choice(segments), rng)
        elif op < 0.8:                            # a CFG branch forks another branch of its request
            src = rng.choice(list(truth))
            req, next_id = next_id, next_id + 1
            kv.fork(src, req)
            truth[req] = list(truth[src])
        else:
            req = rng.choice(list(truth))
            kv.free(req)
            del truth[req]
        _check(kv, content, truth)
    assert hits > 50 and kv.allocator.stats.evictions > 50    # the run did reuse and evict (94 and 190 here)
    for req in list(truth):
        kv.free(req)
    assert kv.allocator.num_free == NUM_BLOCKS
