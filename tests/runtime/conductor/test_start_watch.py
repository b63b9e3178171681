"""When a server's start gives up on its workers: after `timeout` s without a start step of a rank
that is not ready (runtime/ranks/start_watch.py), not after a fixed total time, so a rank
compiling its decode steps for many minutes starts as long as each step comes in time."""
from __future__ import annotations

from runtime.ranks.start_watch import StartWatch
from runtime.transport.messages import Heartbeat

T0 = 1000.0


def _beat(rank: int, steps: int, last: str = "") -> Heartbeat:
    return Heartbeat(rank=rank, start_steps=steps, start_last=last)


def test_a_rank_stepping_within_the_timeout_is_waited_for_however_long_it_takes() -> None:
    watch = StartWatch(300.0, now=T0)
    for i in range(1, 11):          # ten steps 250 s apart: 2,500 s in all, never 300 s without one
        now = T0 + 250.0 * i
        assert watch.stalled({0: _beat(0, i, f"compiled bucket {i}")}, set(), 1, now=now) is None
    assert watch.stalled({0: _beat(0, 10)}, set(), 1, now=T0 + 2500.0 + 299.0) is None


def test_a_rank_without_a_step_for_the_timeout_fails_the_start_naming_its_last_step() -> None:
    watch = StartWatch(300.0, now=T0)
    assert watch.stalled({0: _beat(0, 2, "loaded lm")}, set(), 1, now=T0 + 10.0) is None
    # heartbeats keep coming (the process lives) but no new step: a hang, not progress
    why = watch.stalled({0: _beat(0, 2, "loaded lm")}, set(), 1, now=T0 + 311.0)
    assert why is not None and "rank 0" in why and "loaded lm" in why and "301 s" in why


def test_a_rank_never_heard_from_fails_after_the_timeout_from_the_start() -> None:
    watch = StartWatch(300.0, now=T0)
    assert watch.stalled({}, set(), 2, now=T0 + 299.0) is None
    why = watch.stalled({0: _beat(0, 5)}, set(), 2, now=T0 + 301.0)
    assert why is not None and "rank 1" in why and "no start step reported" in why


def test_ready_ranks_are_not_watched() -> None:
    watch = StartWatch(300.0, now=T0)
    assert watch.stalled({0: _beat(0, 1)}, {0}, 1, now=T0 + 5000.0) is None


def test_a_rank_restarted_during_the_start_counts_its_new_steps_as_progress() -> None:
    watch = StartWatch(300.0, now=T0)
    assert watch.stalled({0: _beat(0, 4, "compiled bucket 4")}, set(), 1, now=T0 + 200.0) is None
    # its worker died and a fresh one loads again: 1 step, fewer than before, yet a step
    assert watch.stalled({0: _beat(0, 1, "loaded lm")}, set(), 1, now=T0 + 450.0) is None
    assert watch.stalled({0: _beat(0, 1, "loaded lm")}, set(), 1, now=T0 + 700.0) is None
    assert watch.stalled({0: _beat(0, 1, "loaded lm")}, set(), 1, now=T0 + 751.0) is not None
