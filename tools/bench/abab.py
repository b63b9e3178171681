"""Alternate the compared sides: warm-up, then rounds A B A B ... (or A B C A B C ...).

The machine is noisy, so no side runs all its repeats in one block: each round runs
every side once, in the same order, and ratios are taken within a round. `settle`, when
given, runs before every run (bench.quiet.wait_quiet: the machine idle again after the run
before, whichever side it was).
"""
from __future__ import annotations

from typing import Callable, Mapping

Measure = Callable[[], Mapping[str, float]]  # one run of one side -> metric name -> value
Samples = dict[str, dict[str, list[float]]]  # side -> metric -> one value per round


def alternate(sides: Mapping[str, Measure], rounds: int, warmup: int = 1,
              progress: Callable[[int, str], None] | None = None,
              settle: Callable[[], object] | None = None) -> Samples:
    """Run `warmup` unrecorded rounds, then `rounds` recorded ones, all sides per round.

    `progress(done, side)` is called after every recorded run (progress bars); `settle()`
    before every run, warm-up ones included.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    settle = settle or (lambda: None)
    for _ in range(warmup):
        for measure in sides.values():
            settle()
            measure()
    samples: Samples = {name: {} for name in sides}
    done = 0
    for _ in range(rounds):
        for name, measure in sides.items():
            settle()
            for metric, value in measure().items():
                samples[name].setdefault(metric, []).append(float(value))
            done += 1
            if progress is not None:
                progress(done, name)
    return samples
