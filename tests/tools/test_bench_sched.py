"""The sched suite: the conductor against null workers keeps its requests live and times real steps."""
from __future__ import annotations

from pathlib import Path

from bench.registry import Context
from bench.suite_sched import STEPS, TRACED_STEPS, NullConductor, run

ROOT = Path(__file__).resolve().parents[2]


def test_null_workers_answer_every_row_and_keep_requests_live() -> None:
    harness = NullConductor(Context(rounds=1, quick=True, root=ROOT), live=40)
    try:
        before = [len(r.output_ids) for r in harness.reqs]
        got = harness.measure()
        after = [len(r.output_ids) for r in harness.reqs]
    finally:
        harness.close()
    assert got["rows"] == min(40, harness.batch)            # one full batch per step, the busy node's limit
    # every answered row (timed steps and counted ones) is one token of a live request
    assert sum(after) - sum(before) == got["rows"] * (STEPS + TRACED_STEPS)
    assert got["us"] > 0 and got["cpu_us"] > 0
    # per_req is cpu_us / 40: multiplied back, a rounding or two of 1.1e-16 relative; measured exact
    assert abs(got["per_req"] * 40 - got["cpu_us"]) < 1e-6 * got["cpu_us"]
    assert got["advanced"] == sum(1 for a, b in zip(after, before) if a > b) >= harness.batch
    assert set().union(*(r.output_ids for r in harness.reqs)) == {7}


def test_quick_suite_reports_plain_rows_with_no_baseline() -> None:
    rows = run(Context(rounds=1, quick=True, root=ROOT))
    cpu = "conductor CPU time per step (thread time)"
    assert [(r.case, r.metric) for r in rows][::5] == [("1 live", cpu), ("8 live", cpu), ("8 live, prefix cache", cpu)]
    assert rows[1].metric.startswith("conductor wall time per step")
    assert rows[3].metric.startswith("one /v1/state snapshot")
    assert rows[4].metric.startswith("conductor Python opcodes per step")
    assert all(r.b is None and len(r.a.samples) == 1 and r.a.samples[0] > 0 for r in rows)


def test_state_snapshot_counts_every_live_request_where_it_rests() -> None:
    harness = NullConductor(Context(rounds=1, quick=True, root=ROOT), live=40)
    try:
        harness.measure()
        state = harness.conductor.live.snapshot(harness.conductor)
        by_state = [r.state.name.lower() for r in harness.conductor.requests.values()]
        in_flight = sum(len(f.batch.entries) for f in harness.conductor.in_flight.values())
    finally:
        harness.close()
    lm = state["nodes"]["lm"]
    assert lm["waiting"] + lm["running"] == 40 == state["num_requests"] == len(state["requests"])
    assert lm["running"] == in_flight <= harness.batch
    assert lm["batches"] > 0 and lm["last_batch"] == harness.batch
    assert state["tasks"]["chat"] == {s: by_state.count(s) for s in ("waiting", "running", "preempted")}
    assert sum(state["tasks"]["chat"].values()) == 40
    assert {t["walk"] for r in state["requests"] for t in r["tracks"]} <= {"prefill", "decode"}


def test_opcode_count_is_the_same_work_each_time_and_grows_with_the_rows() -> None:
    """The work row reproduces (only the conductor's time-based checks, a few opcodes, vary) and
    counts every decode row of a step."""
    one, full = (NullConductor(Context(rounds=1, quick=True, root=ROOT), live=n) for n in (1, 40))
    block = one.conductor.ledger.pool(0, "lm").block_size
    try:
        # windows of one KV block's steps: each holds the one step whose row takes a new block (`try_grow` and
        # `tell`, some tens of opcodes more than a row into its own last block: 5-step windows differ by 3 %)
        counts = [one.opcodes_per_step(block), one.opcodes_per_step(block)]
        rows = full.opcodes_per_step(block)
    finally:
        one.close()
        full.close()
    # not rounding: steady decode is the same work but for the conductor's time-based checks, a few opcodes a step
    # (the docstring); measured 0 of 1,696 over 16-step windows (12.4 of 1612 over 5 steps before the tables moved)
    assert counts[0] > 0 and abs(counts[0] - counts[1]) <= 0.01 * counts[0]
    assert rows > counts[0] * full.batch / 4                 # a full batch is many rows' work, not one's
