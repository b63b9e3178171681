"""The ledger of caches whose worker decides reuse itself (BAGEL, the Qwen3-Omni thinker): counted
from the worker's reports plus full charges for unanswered Runs (runtime/conductor/kv_ledger.py).

The randomised test drives a real `KVBlockManager` with prefix caching and forks (what BAGEL's
engine does with its CFG branches and cached images) as a worker would, with messages queued both
ways and delivered in random order per direction, and checks at every step that the conductor's
count is never below what the cache holds, that the cache never runs out of what the conductor
allowed, and that once everything is delivered the count equals the cache's exactly."""
from __future__ import annotations

import random
from collections import deque

import pytest

from runtime.conductor.kv_ledger import KVLedger, ReportedPoolLedger
from runtime.model_executor.kv import KVBlockManager

BS = 4


def ledger(*sizes: int) -> tuple[KVLedger, list[ReportedPoolLedger]]:
    led = KVLedger()
    nodes = ["full", "cfg_text", "cfg_img"][:len(sizes)]
    for node, n in zip(nodes, sizes):
        led.add_pool(0, node, n, BS, reported_by="full")
    return led, [led.pool(0, n) for n in nodes]


def test_unanswered_runs_are_charged_in_full_and_answered_ones_as_reported() -> None:
    led, (full, text) = ledger(10, 10)
    assert full.account() is text.account() and full.free_blocks() == 20    # one cache, the pools' sum
    assert full.can_grow(1, 40) and not full.can_grow(1, 81)
    full.grow(1, 40)                       # 10 blocks, unanswered
    text.grow(1, 40)                       # its fork: 10 more charged, though the worker will share them
    assert full.free_blocks() == 0 and not text.can_grow(2, 1)
    led.note_used(0, {"full": 10}, "full")  # the full branch's batch answered: the cache holds 10 ...
    assert full.free_blocks() == 0          # ... and the fork is still unanswered
    led.note_used(0, {"full": 10}, "cfg_text")
    assert full.free_blocks() == 10 and led.usage() == 0.5
    assert full.needed(1, 1) == 1 and full.needed(1, 0) == 0   # a full last block: one new block
    full.grow(1, 1)
    assert full.needed(1, 1) == 1          # a partly filled one may be shared: its copy is charged


def test_a_free_counts_once_the_worker_reports_it() -> None:
    led, (full,) = ledger(8)
    full.grow(7, 32)
    led.note_used(0, {"full": 8}, "full")
    led.free_request(7)                    # the close is on its way: the blocks are still held
    assert full.free_blocks() == 0 and full.holders() == [] and full.frees_pending()
    led.note_used(0, {"full": 8}, "full")  # a batch answered before the close: still pending
    assert full.frees_pending()
    led.note_used(0, {"full": 0}, closed=[7])   # KVUsage after the close
    assert full.free_blocks() == 8 and not full.frees_pending()
    led.free_request(9)                    # a request that held nothing here awaits nothing
    assert not full.frees_pending()


def test_a_failed_batch_counts_until_the_next_report() -> None:
    led, (full, text) = ledger(8, 8)
    full.grow(1, 16)
    full.forget([1])                       # BatchFailed: what it allocated is unknown
    assert full.free_blocks() == 12
    text.grow(2, 8)
    led.note_used(0, {"full": 3}, "cfg_text")   # a later report covers the failed batch
    assert full.free_blocks() == 13
    led.free_rank(0)                       # the worker restarts with an empty cache
    assert full.free_blocks() == 16 and led.peak_usage() > 0


def test_another_ranks_report_or_an_unknown_node_changes_nothing() -> None:
    led, (full,) = ledger(8)
    full.grow(1, 16)
    led.note_used(1, {"full": 0}, "full")
    led.note_used(0, {"talker": 0}, "talker")
    assert full.free_blocks() == 4


class Worker:
    """A worker's side: one prefix-caching block manager shared by the nodes, fed in message order."""

    def __init__(self, num_blocks: int) -> None:
        self.blocks = KVBlockManager(num_blocks, BS, prefix_root=b"root")

    def used(self) -> int:
        return self.blocks.allocator.num_blocks - self.blocks.allocator.num_free

    def run(self, node: str, items: list[tuple[int, list[int]]]) -> None:
        for rid, rows in items:
            seq = (rid, node)
            if seq not in self.blocks and node != "full" and (rid, "full") in self.blocks \
                    and self.blocks.num_tokens((rid, "full")) == len(rows):
                self.blocks.fork((rid, "full"), seq)           # a CFG branch shares the full branch's rows
            elif seq not in self.blocks:
                self.blocks.allocate(seq, len(rows), rows, self.blocks.prefix_hit(rows))
            else:
                self.blocks.append(seq, len(rows), rows)        # may copy a shared partly filled block
        for rid, _ in items:
            self.blocks.commit((rid, node))

    def close(self, rid: int) -> None:
        for node in ("full", "cfg_text"):
            if (rid, node) in self.blocks:
                self.blocks.free((rid, node))


@pytest.mark.parametrize("seed", range(6))
def test_randomised_the_count_never_falls_below_the_cache_and_settles_on_it(seed: int) -> None:
    rng = random.Random(seed)
    led, pools = ledger(24, 24)
    nodes = {"full": pools[0], "cfg_text": pools[1]}
    worker = Worker(48)
    prompts = [[rng.randrange(50) for _ in range(rng.randrange(6, 30))] for _ in range(4)]
    to_worker: deque = deque()
    to_conductor: deque = deque()
    in_flight: set[str] = set()
    rows: dict[int, list[int]] = {}        # request -> its rows so far (both branches get the same)
    fed: dict[tuple[int, str], int] = {}   # (request, node) -> rows the conductor counted
    next_id, ran = 1, 0

    def check() -> None:
        assert pools[0].account().used_blocks >= worker.used()

    for _ in range(3000):
        op = rng.random()
        if op < 0.3:                                         # form a batch for an idle node
            node = rng.choice(sorted(set(nodes) - in_flight) or ["-"])
            if node == "-":
                continue
            items = []
            for rid in rng.sample(sorted(rows), min(len(rows), 3)):
                done = fed.get((rid, node), 0)
                if node == "full" and done == len(rows[rid]):
                    rows[rid].append(rng.randrange(50))      # a decode row
                new = rows[rid][done:]
                if new and nodes[node].can_grow(rid, len(new)):
                    nodes[node].grow(rid, len(new))
                    fed[(rid, node)] = len(rows[rid])
                    items.append((rid, new))
            if items:
                to_worker.append(("run", node, items))
                in_flight.add(node)
        elif op < 0.42 and len(rows) < 6:                   # a new request, its prompt sharing a prefix
            prompt = rng.choice(prompts)[:rng.randrange(4, 30)] + [rng.randrange(50) for _ in range(rng.randrange(3))]
            rows[next_id] = prompt
            next_id += 1
        elif op < 0.5 and rows:                              # a request ends (even with a Run in flight)
            rid = rng.choice(sorted(rows))
            led.free_request(rid)
            del rows[rid]
            fed = {k: v for k, v in fed.items() if k[0] != rid}
            to_worker.append(("close", rid))
        elif op < 0.75 and to_worker:                        # the worker takes its next message
            msg = to_worker.popleft()
            if msg[0] == "run":
                worker.run(msg[1], msg[2])                   # raises OutOfBlocks if the count was wrong
                to_conductor.append(("done", msg[1], worker.used(), []))
                ran += 1
            else:
                worker.close(msg[1])
                to_conductor.append(("usage", None, worker.used(), [msg[1]]))
        elif to_conductor:                                   # the conductor takes the worker's next one
            kind, node, used, closed = to_conductor.popleft()
            led.note_used(0, {"full": used}, node, closed)
            if kind == "done":
                in_flight.discard(node)
        check()
    while to_worker or to_conductor:
        while to_worker:
            msg = to_worker.popleft()
            if msg[0] == "run":
                worker.run(msg[1], msg[2])
                to_conductor.append(("done", msg[1], worker.used(), []))
            else:
                worker.close(msg[1])
                to_conductor.append(("usage", None, worker.used(), [msg[1]]))
            check()
        kind, node, used, closed = to_conductor.popleft()
        led.note_used(0, {"full": used}, node, closed)
        check()
    assert ran > 200
    assert pools[0].account().used_blocks == worker.used()   # settled: the count is the cache's
    assert not pools[0].frees_pending()                        # every close was reported
    assert worker.blocks.allocator.stats.hit_tokens > 0       # prompts did share cached blocks
