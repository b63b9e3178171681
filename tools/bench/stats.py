"""Summary statistics of benchmark samples: median/min/max, percentiles, A/B ratios, and the median
time of a few calls (what in-process kernel suites keep of each sample).

Ratios are taken per alternation round (A_i against B_i, measured back to back on the
same weights), then summarised; a ratio > 1 always means mstar (side A) is ahead,
whichever way the metric points.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from time import perf_counter
from typing import Callable, Sequence

LOWER, HIGHER = "lower", "higher"  # which way a metric is better


@dataclass(frozen=True)
class Summary:
    """Median, minimum and maximum of a list of samples."""

    median: float
    min: float
    max: float
    n: int

    def to_dict(self) -> dict[str, float]:
        return {"median": self.median, "min": self.min, "max": self.max, "n": self.n}


def summarize(samples: Sequence[float]) -> Summary:
    if not samples:
        raise ValueError("cannot summarise an empty list of samples")
    return Summary(statistics.median(samples), min(samples), max(samples), len(samples))


def median_time(fn: Callable[[], object], calls: int) -> float:
    """Seconds of the median of `calls` timed calls of `fn`."""
    times = []
    for _ in range(calls):
        start = perf_counter()
        fn()
        times.append(perf_counter() - start)
    return statistics.median(times)


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation between order statistics (numpy's default)."""
    if not samples:
        raise ValueError("percentile of an empty list")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def round_ratios(a: Sequence[float], b: Sequence[float], better: str) -> list[float]:
    """Per-round advantage of A over B: B/A for lower-is-better metrics, A/B for higher."""
    if len(a) != len(b):
        raise ValueError(f"A has {len(a)} samples and B {len(b)}: ratios need paired rounds")
    if better not in (LOWER, HIGHER):
        raise ValueError(f"better must be {LOWER!r} or {HIGHER!r}, got {better!r}")
    num, den = (b, a) if better == LOWER else (a, b)
    return [n / d for n, d in zip(num, den)]


def verdict(ratios: Summary, names: tuple[str, str] = ("mstar", "baseline")) -> str:
    """Plain words for a ratio summary of A (names[0]) over B: who is ahead, or that noise decides."""
    a, b = names
    if ratios.min > 1:
        return f"{a} ahead ({ratios.median:.2f}x)"
    if ratios.max < 1:
        return f"{a} behind ({ratios.median:.2f}x): {b} ahead"
    lead = a if ratios.median >= 1 else b
    return f"within noise ({ratios.median:.2f}x, median favours {lead})"
