"""Request states (the legal transitions, listed) and the track cursor on a compiled plan."""
from __future__ import annotations

import asyncio

import pytest

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.conductor.cursor import TrackCursor
from runtime.conductor.kv_ledger import KVPoolLedger
from runtime.conductor.request import LEGAL_TRANSITIONS, IllegalTransition, Request, RequestState as S
from tests.runtime.serving.conftest import REPO
from runtime.transport.request_params import RequestParams

LEGAL = {
    (S.WAITING, S.RUNNING), (S.WAITING, S.ABORTED), (S.WAITING, S.FAILED),
    (S.RUNNING, S.PREEMPTED), (S.RUNNING, S.FINISHED), (S.RUNNING, S.ABORTED), (S.RUNNING, S.FAILED),
    (S.PREEMPTED, S.RUNNING), (S.PREEMPTED, S.ABORTED), (S.PREEMPTED, S.FAILED),
}


def test_the_transition_table_is_exactly_the_legal_list() -> None:
    assert {(a, b) for a, bs in LEGAL_TRANSITIONS.items() for b in bs} == LEGAL
    assert all(s.is_final == (s >= S.FINISHED) for s in S)


def _request(plan, max_tokens: int = 3, stop: frozenset[int] = frozenset()) -> Request:
    tracks = [TrackCursor(i, t, plan) for i, t in enumerate(plan.task("chat").tracks)]
    return Request(1, "chat", RequestParams(declared={"max_tokens": max_tokens}), [("text", [5, 6, 7])], tracks, stop)


@pytest.fixture(scope="module")
def plan():
    return compile_file(str(REPO / "graphs" / "smollm2.yaml"), Options(preset="tiny")).plan


@pytest.mark.parametrize("move", ["admit", "preempt", "resume", "finish", "abort", "fail"])
def test_every_illegal_move_is_refused(plan, move: str) -> None:
    async def check() -> None:
        for state in S:
            req = _request(plan)
            req.state = state
            args = ("x",) if move in ("finish", "fail") else ()
            target = {"admit": S.RUNNING, "preempt": S.PREEMPTED, "resume": S.RUNNING, "finish": S.FINISHED,
                      "abort": S.ABORTED, "fail": S.FAILED}[move]
            if target in LEGAL_TRANSITIONS[state]:
                getattr(req, move)(*args)
                assert req.state == target
            else:
                with pytest.raises(IllegalTransition):
                    getattr(req, move)(*args)
    asyncio.run(check())


def _drive(plan, req: Request, tokens: list[int]) -> list[tuple[str, list[int]]]:
    """Play the worker: answer every ready Run with the next token; return (walk, step) per Run."""
    cursor = req.tracks[0]
    cursor.settle(req)
    seen = []
    for tok in tokens:
        (pending,) = cursor.ready()
        seen.append((pending.walk, pending.step))
        cursor.start(pending)
        assert cursor.ready() == []          # one Run in flight at a time per track
        req.values.setdefault("lm.token", []).append(tok)
        req.last_values["lm.token"] = [tok]
        cursor.complete(pending, req)
        if cursor.is_done:
            break
    return seen


def test_cursor_runs_prefill_then_decode_until_max(plan) -> None:
    req = _request(plan, max_tokens=3)
    seen = _drive(plan, req, [1, 2, 3, 4, 5, 6])
    assert seen == [("prefill", 0), ("decode", 0), ("decode", 1), ("decode", 2)]
    assert req.tracks[0].is_done and req.tracks[0].exit_reason == "max"


def test_cursor_stops_early_at_eos(plan) -> None:
    req = _request(plan, max_tokens=10, stop=frozenset({9}))
    seen = _drive(plan, req, [1, 2, 9, 4])
    assert len(seen) == 3 and req.tracks[0].exit_reason == "eos"


def test_kv_ledger_counts_blocks_like_the_block_manager() -> None:
    pool = KVPoolLedger(num_blocks=4, block_size=16)
    assert pool.needed(1, 17) == 2
    pool.grow(1, 17)
    assert pool.needed(1, 15) == 0 and pool.needed(1, 16) == 1
    assert pool.can_grow(2, 32) and not pool.can_grow(2, 33)
    pool.free(1)
    assert pool.used_blocks == 0


def _cursor_state(cursor: TrackCursor) -> tuple:
    return (cursor.state, cursor.walk.name if cursor.walk else None, cursor.pc, cursor.exit_reason,
            {k: (v.counter, v.trips) for k, v in cursor.loops.items()}, [(p.walk, p.step) for p in cursor.ready()])


@pytest.mark.parametrize("max_tokens, stop, tokens, forced_at", [
    (3, frozenset(), [1, 2, 3, 4, 5], None),          # leaves by "max"
    (10, frozenset({9}), [1, 2, 9, 4], None),          # by "eos"
    (10, frozenset(), [1, 2, 3, 4, 5, 6], 3),          # a stop string set on the cursor mid-loop
    (1, frozenset(), [1, 2, 3], None),                 # a one-trip loop
])
def test_a_decode_loop_end_passed_in_complete_is_what_settle_does(plan, max_tokens, stop, tokens, forced_at) -> None:
    """complete() passes the end of a loop whose body is one Run itself (every decode row of every
    step); the reference moves the pc past the Run and lets settle() pass the end, op by op. After
    every Run both cursors are in the same state with the same ready Runs, whatever ends the loop."""
    fast, slow = _request(plan, max_tokens, stop), _request(plan, max_tokens, stop)
    for req in (fast, slow):
        req.tracks[0].settle(req)
    passed = 0
    for i, tok in enumerate(tokens):
        assert _cursor_state(fast.tracks[0]) == _cursor_state(slow.tracks[0])
        if fast.tracks[0].is_done:
            break
        for req in (fast, slow):
            cursor = req.tracks[0]
            (pending,) = cursor.ready()
            cursor.start(pending)
            req.values.setdefault("lm.token", []).append(tok)
            req.last_values["lm.token"] = [tok]
            if i == forced_at:
                cursor.forced_exit = "stop"
            if req is fast:
                cursor.complete(pending, req)
            else:
                passed += pending.walk == "decode"
                cursor.in_flight.discard(pending.branch)
                cursor.pc += 1
                cursor.settle(req)
    assert fast.tracks[0].is_done and _cursor_state(fast.tracks[0]) == _cursor_state(slow.tracks[0])
    assert passed >= 1      # the decode loop ran: the path under test was taken
