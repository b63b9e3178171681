"""A/B alternation: order, warm-up, rounds."""
from __future__ import annotations

import pytest

from bench.abab import alternate


def test_sides_alternate_every_round_and_warmup_is_not_recorded():
    calls: list[str] = []

    def side(name: str):
        def measure() -> dict[str, float]:
            calls.append(name)
            return {"t": float(len(calls))}
        return measure

    samples = alternate({"A": side("A"), "B": side("B")}, rounds=3, warmup=1)
    assert calls == ["A", "B"] * 4
    # values record the call index: the warm-up calls (1, 2) are not among the samples
    assert samples == {"A": {"t": [3.0, 5.0, 7.0]}, "B": {"t": [4.0, 6.0, 8.0]}}


def test_three_sides_round_robin_and_progress():
    order: list[str] = []
    seen: list[tuple[int, str]] = []
    sides = {n: (lambda n=n: order.append(n) or {"x": 1.0}) for n in "ABC"}
    alternate(sides, rounds=2, warmup=0, progress=lambda done, name: seen.append((done, name)))
    assert order == list("ABCABC")
    assert seen == [(1, "A"), (2, "B"), (3, "C"), (4, "A"), (5, "B"), (6, "C")]
    with pytest.raises(ValueError):
        alternate(sides, rounds=0)
