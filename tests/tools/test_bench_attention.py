"""The attention suite compares what it says: tables laid by the real allocator (in runs) against the same
blocks interleaved one by one."""
from __future__ import annotations

from bench.suite_attention import BLOCK, CONTEXT, REQUESTS, allocator_tables, scattered_tables


def _stretches(row: list[int]) -> int:
    return 1 + sum(1 for a, b in zip(row, row[1:]) if b != a + 1)


def test_the_allocators_tables_are_runs_and_the_baselines_are_not() -> None:
    runs, scattered = allocator_tables(), scattered_tables()
    assert runs.shape == scattered.shape == (REQUESTS, CONTEXT // BLOCK)
    assert sorted(runs.flatten().tolist()) == sorted(scattered.flatten().tolist())     # the same blocks
    assert all(_stretches(row) == 1 for row in runs.tolist())
    assert all(_stretches(row) == CONTEXT // BLOCK for row in scattered.tolist())
