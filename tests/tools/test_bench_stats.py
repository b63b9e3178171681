"""Median/min/max, percentiles, per-round ratios and verdicts of the benchmark suite."""
from __future__ import annotations

import random

import pytest

from bench.stats import HIGHER, LOWER, percentile, round_ratios, summarize, verdict


def test_summary_is_median_min_max():
    s = summarize([3.0, 1.0, 10.0, 2.0])
    assert (s.median, s.min, s.max, s.n) == (2.5, 1.0, 10.0, 4)
    with pytest.raises(ValueError):
        summarize([])


def test_percentile_matches_linear_interpolation():
    numpy = pytest.importorskip("numpy")
    rng = random.Random(0)
    for n in (1, 2, 5, 16, 33):
        xs = [rng.random() for _ in range(n)]
        for q in (0, 50, 95, 100):
            # the same linear interpolation written otherwise than numpy's: a rounding or two of 1.1e-16 relative,
            # inside approx's default rel 1e-6; measured equal
            assert percentile(xs, q) == pytest.approx(float(numpy.percentile(xs, q)))
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_ratio_above_one_means_a_ahead_either_way():
    # A takes half the time of B: ahead by 2x on a lower-is-better metric
    assert round_ratios([1.0, 2.0], [2.0, 4.0], LOWER) == [2.0, 2.0]
    # A has a third of B's throughput: behind on a higher-is-better metric
    assert round_ratios([1.0], [3.0], HIGHER) == [pytest.approx(1 / 3)]     # a division: rounded, approx's rel 1e-6
    with pytest.raises(ValueError, match="paired"):
        round_ratios([1.0], [1.0, 2.0], LOWER)
    with pytest.raises(ValueError):
        round_ratios([1.0], [1.0], "faster")


def test_verdict_says_plainly_who_is_ahead():
    assert verdict(summarize([1.5, 2.0, 2.5])).startswith("mstar ahead")
    behind = verdict(summarize([0.5, 0.7, 0.9]))
    assert "mstar behind" in behind and "baseline ahead" in behind
    assert verdict(summarize([0.9, 1.2, 1.4])).startswith("within noise")
    assert "vllm ahead" in verdict(summarize([1.1, 1.2]), ("vllm", "hf"))
