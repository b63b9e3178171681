"""A/B alternation: ABBA order, warm-up, rounds."""
from __future__ import annotations

import pytest

from bench.abab import alternate, round_order


def test_rounds_run_abba_so_each_side_holds_each_place_equally_often():
    assert [round_order(["A", "B"], i) for i in range(4)] == [["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]
    assert [round_order(list("ABC"), i) for i in range(2)] == [list("ABC"), list("CBA")]
    firsts = [round_order(["A", "B"], i)[0] for i in range(6)]
    assert firsts.count("A") == firsts.count("B") == 3


def test_sides_alternate_every_round_and_warmup_is_not_recorded():
    calls: list[str] = []

    def side(name: str):
        def measure() -> dict[str, float]:
            calls.append(name)
            return {"t": float(len(calls))}
        return measure

    samples = alternate({"A": side("A"), "B": side("B")}, rounds=3, warmup=1)
    assert calls == ["A", "B"] + ["A", "B", "B", "A", "A", "B"]     # warm-up as given, then ABBA
    # values record the call index: the warm-up calls (1, 2) are not among the samples, each side's in round order
    assert samples == {"A": {"t": [3.0, 6.0, 7.0]}, "B": {"t": [4.0, 5.0, 8.0]}}


def test_three_sides_reverse_every_round_and_progress():
    order: list[str] = []
    seen: list[tuple[int, str]] = []
    sides = {n: (lambda n=n: order.append(n) or {"x": 1.0}) for n in "ABC"}
    alternate(sides, rounds=2, warmup=0, progress=lambda done, name: seen.append((done, name)))
    assert order == list("ABCCBA")
    assert seen == [(1, "A"), (2, "B"), (3, "C"), (4, "C"), (5, "B"), (6, "A")]
    with pytest.raises(ValueError):
        alternate(sides, rounds=0)


def test_settle_runs_before_every_run_warmup_included():
    events: list[str] = []
    sides = {n: (lambda n=n: events.append(n) or {"x": 1.0}) for n in "AB"}
    alternate(sides, rounds=2, warmup=1, settle=lambda: events.append("settle"))
    assert events == ["settle", "A", "settle", "B"] * 2 + ["settle", "B", "settle", "A"]


def test_wait_quiet_waits_out_spinning_processes():
    """Children busy-looping on a fifth of the cores (at least one) keep the machine >= 20 % busy,
    above the quiet threshold of 10 %: the wait must outlast them (or give up at its timeout on a
    machine that is busy anyway, which returns the timeout)."""
    import os
    import subprocess
    import sys

    from bench import quiet

    if quiet.cpu_times() is None:
        pytest.skip("no /proc/stat here")
    spin = "import time\nend = time.monotonic() + 1.0\nwhile time.monotonic() < end: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(-(-(os.cpu_count() or 1) // 5))]
    try:
        waited = quiet.wait_quiet(timeout_s=30.0)
        running = sum(s.poll() is None for s in spinners)
        assert running == 0 or waited >= 30.0, f"declared quiet after {waited:.2f} s with {running} spinning"
    finally:
        for s in spinners:
            s.kill()
            s.wait()
