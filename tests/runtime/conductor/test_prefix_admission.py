"""Admission with a prefix-caching pool: the real Scheduler on the tiny KV graph (8 blocks of 16
tokens). A request whose prompt prefix another running request already holds needs only the
blocks beyond it, is admitted where a plain pool would hold it, and its item tells the worker
how many prompt tokens to reuse."""
from __future__ import annotations

from pathlib import Path

import pytest

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.conductor.request import RequestState
from runtime.model_executor.kv import prefix_root
from tests.runtime.conductor.test_kv_scheduling import Bench


@pytest.fixture(scope="module")
def plan():
    return compile_file(str(Path(__file__).with_name("tiny_kv.yaml")), Options()).plan


def bench(plan, cached: bool) -> Bench:
    b = Bench(plan)
    b.ledger.add_pool(0, "lm", 8, 16, prefix_root("tiny-kv", "lm") if cached else None)
    return b


def step(b: Bench) -> dict[int, int]:
    """One scheduling pass, results applied: request id -> the prompt tokens its item reuses."""
    running = [r for r in b.requests.values() if r.state == RequestState.RUNNING]
    batches = b.scheduler.schedule(running, list(b.waiting), set(), {0})
    b.waiting = [r for r in b.waiting if r.state in (RequestState.WAITING, RequestState.PREEMPTED)]
    placed = [e for batch in batches for e in batch.entries]
    for e in placed:
        e.request.values.setdefault("lm.token", []).append(1)
        e.request.last_values["lm.token"] = [1]
        e.request.tracks[e.pending.track].complete(e.pending, e.request)
    return {e.request.request_id: e.item.cached for e in placed}


@pytest.mark.parametrize("cached", [True, False])
def test_a_request_sharing_a_held_prefix_needs_only_the_blocks_beyond_it(plan, cached: bool) -> None:
    b = bench(plan, cached)
    b.submit(1, 80)                             # 5 full blocks, running (decoding) from here on
    assert step(b) == {1: 0}
    b.submit(2, 90)                             # the same 80-token prefix + 10: 6 blocks, 3 free
    placed = step(b)
    pool = b.ledger.pool(0, "lm")
    if cached:
        assert placed == {1: 0, 2: 80}          # admitted: reuses the 5 blocks request 1 holds
        assert pool.used_blocks == 6 + 1        # 5 shared + 1 new of request 2 + request 1's decode block
        assert b.scheduler.holds == 0
    else:
        assert placed == {1: 0}                 # 6 blocks do not fit in 3: held
        assert b.scheduler.holds == 1


def test_a_finished_requests_cached_blocks_are_reused_and_still_count_as_room(plan) -> None:
    b = bench(plan, cached=True)
    b.submit(1, 80)
    step(b)
    b.ledger.free_request(1)                    # finished: its blocks stay cached but belong to nobody
    b.requests[1].fail("done")
    pool = b.ledger.pool(0, "lm")
    assert pool.used_blocks == 0 and pool.tables.allocator.num_cached == 5
    b.submit(2, 90)
    assert step(b) == {2: 80}
    b.submit(3, 7 * 16)                         # all 7s: shares request 2's 5 blocks, needs 2 more of 2 free
    assert step(b) == {2: 0, 3: 80}
    assert pool.used_blocks == 8
