"""One pool for the nodes that share one cache (BAGEL's CFG branches on a rank), owned by the conductor
(runtime/conductor/kv_ledger.py: `BranchPool`, whole segments, keyed partly filled last blocks).

The randomised test checks the tables against a stand-in for the worker's cache that shares none of the
ledger's code: it applies each Run's table changes and copies as told, writes the rows of each segment
it is told to compute into their slots, and asserts that a segment the conductor calls reused is in the
slots it was handed, row for row, and that a segment is reused whole or not at all."""
from __future__ import annotations

import random

import pytest

from runtime.conductor.kv_ledger import BranchPool, KVLedger, KVPoolLedger
from runtime.transport.messages import NodeInfo, WorkItem
from runtime.conductor.plan_index import PlanIndex
from tests.runtime.models.bagel.bagel_harness import tiny_plan

BS = 4
NODES = ("full", "cfg_text", "cfg_img")


def shared(num_blocks: int = 30, root: bytes | None = b"root") -> dict[str, BranchPool]:
    pool = KVPoolLedger(num_blocks, BS, root, tails=True)
    return {n: BranchPool(pool, n, reports=n == "full") for n in NODES}


def segment(tag: str, n: int) -> list[bytes]:
    return [f"{tag}{i}".encode() for i in range(n)]


def test_nodes_naming_one_pool_share_it_and_the_pool_is_their_sum() -> None:
    lms = ("llm", "llm_cfg_text", "llm_cfg_img")
    led = KVLedger()
    led.add_rank(0, [NodeInfo(name=n, kind="bagel_mot_lm", weight_source="seed:0", kv_blocks=10, kv_block_size=BS,
                              kv_prefix_key="ab", kv_pool="llm") for n in lms], PlanIndex(tiny_plan()), prefix_cache=True)
    pools = [led.pool(0, n) for n in lms]
    assert len({id(p.account()) for p in pools}) == 1 and pools[0].num_blocks == 30
    assert [p.stats is not None for p in pools] == [True, False, False]    # shown once, under "llm"
    assert len(led.accounts()) == 1 and set(led.prefix_stats()) == {(0, "llm")}


def test_a_branch_whose_context_equals_another_takes_its_blocks_and_computes_nothing() -> None:
    pools = shared()
    text = segment("t", 6)
    assert pools["full"].try_grow(1, 6, text, whole=True) == 0             # computed
    assert pools["cfg_img"].try_grow(1, 6, text, whole=True) == 6          # the same context: shared, this pass
    pool = pools["full"].account()
    assert pool.tables.table((1, "cfg_img")).blocks == pool.tables.table((1, "full")).blocks
    assert pool.used_blocks == 2
    assert pools["cfg_text"].try_grow(1, 5, segment("t", 5), whole=True) == 0   # another context: its own
    assert pool.used_blocks == 4


def test_a_segment_ending_mid_block_is_found_again_whole_and_its_last_block_copied() -> None:
    pools = shared()
    picture = segment("v", 7)                         # one full block and 3 rows
    pools["full"].try_grow(1, 7, picture, whole=True)
    pools["full"].commit()
    item = WorkItem(2)
    assert pools["full"].try_grow(2, 7, picture, whole=True) == 7
    pools["full"].tell(2, item)
    pool = pools["full"].account()
    first, second = pool.tables.table((1, "full")).blocks, pool.tables.table((2, "full")).blocks
    assert second[0] == first[0] and second[1] != first[1] and item.kv_copies == [(first[1], second[1])]
    assert pools["full"].try_grow(3, 6, picture[:6], whole=True) == 0    # a part of a segment is not it


def test_a_failed_batch_leaves_none_of_its_rows_findable_and_a_refused_segment_changes_nothing() -> None:
    pools = shared(num_blocks=4)
    for n in (7, 3):                                  # full blocks and a partly filled one; a partly filled one alone
        pools["full"].try_grow(1, n, segment("v", n), whole=True)
        pools["full"].commit()
        pools["full"].forget([1])                     # its batch failed: its last block's rows are not there either
        pools["full"].free(1)
        assert pools["full"].try_grow(2, n, segment("v", n), whole=True) == 0
        pools["full"].free(2)
    pools["full"].try_grow(2, 7, segment("v", 7), whole=True)
    pool = pools["full"].account()
    used = pool.used_blocks
    assert pools["cfg_text"].try_grow(3, 12, segment("x", 12), whole=True) is None
    assert pool.used_blocks == used and (3, "cfg_text") not in pool.tables and pools["cfg_text"].holders() == [2]


class Cache:
    """The worker side: slots hold the rows written there; tables as told."""

    def __init__(self) -> None:
        self.slots: dict[int, bytes] = {}
        self.tables: dict[tuple[int, str], list[int]] = {}
        self.held: dict[tuple[int, str], int] = {}

    def run(self, seq: tuple[int, str], item: WorkItem, rows: list[bytes]) -> None:
        for src, dst in item.kv_copies:
            for i in range(BS):
                if src * BS + i in self.slots:
                    self.slots[dst * BS + i] = self.slots[src * BS + i]
        if item.kv_at >= 0:
            self.tables.setdefault(seq, [])[item.kv_at:] = item.kv_blocks
        table, start = self.tables[seq], self.held.get(seq, 0)
        assert len(table) == -(-(start + len(rows)) // BS)                  # exactly the blocks its rows need
        where = [table[p // BS] * BS + p % BS for p in range(start, start + len(rows))]
        if item.cached:
            assert item.cached == len(rows) and [self.slots.get(s) for s in where] == rows
        else:
            self.slots.update(zip(where, rows))
        self.held[seq] = start + len(rows)

    def close(self, rid: int) -> None:
        for seq in [s for s in self.tables if s[0] == rid]:
            del self.tables[seq], self.held[seq]


@pytest.mark.parametrize("seed", range(6))
def test_randomised_reused_segments_hold_their_rows_and_the_count_is_the_cache(seed: int) -> None:
    rng = random.Random(seed)
    pools, cache = shared(num_blocks=24), Cache()
    pool = pools["full"].account()
    pieces = [segment(tag, rng.randrange(1, 11)) for tag in "abcdef"]
    reused = computed = refused = 0
    for _ in range(400):
        rid = rng.randrange(1, 6)
        if rng.random() < 0.1:
            pool.commit()
            for p in pools.values():
                p.free(rid)
            cache.close(rid)
            continue
        node, rows = rng.choice(NODES), rng.choice(pieces)
        if rng.random() < 0.3:                      # a decode row: appended, never whole
            rows, whole = [f"d{rng.randrange(3)}".encode()], False
        else:
            whole = True
        got = pools[node].try_grow(rid, len(rows), rows, whole)
        if got is None:
            refused += 1
            continue
        item = WorkItem(rid, cached=got)
        pools[node].tell(rid, item)
        cache.run((rid, node), item, rows)
        reused, computed = reused + bool(got), computed + (not got)
        if rng.random() < 0.5:                      # the pass ends: its batches' blocks are keyed
            pool.commit()
        held = {b for seq in pool.holders() for b in pool.tables.table(seq).blocks}
        assert pool.used_blocks == len(held)
        assert all(cache.tables[seq] == pool.tables.table(seq).blocks for seq in pool.holders())
    assert reused and computed and refused
