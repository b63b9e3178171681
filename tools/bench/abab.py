"""Alternate the compared sides: warm-up, then rounds in ABBA order (A B, B A, A B, ...).

The machine is noisy, so no side runs all its repeats in one block: each round runs every
side once and ratios are taken within a round. The order reverses every round (with three
sides: A B C, C B A, ...), so no side always runs first, right after the machine settled,
or always runs right after the same neighbour: over an even number of rounds each side
holds each place equally often. `settle`, when given, runs before every run
(bench.quiet.wait_quiet: the machine idle again after the run before, whichever side it was).
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

Measure = Callable[[], Mapping[str, float]]  # one run of one side -> metric name -> value
Samples = dict[str, dict[str, list[float]]]  # side -> metric -> one value per round


def round_order(names: Sequence[str], round_index: int) -> list[str]:
    """The sides in the order recorded round `round_index` (0-based) runs them: as given on even
    rounds, reversed on odd ones (ABBA)."""
    return list(names) if round_index % 2 == 0 else list(reversed(names))


def alternate(sides: Mapping[str, Measure], rounds: int, warmup: int = 1,
              progress: Callable[[int, str], None] | None = None,
              settle: Callable[[], object] | None = None) -> Samples:
    """Run `warmup` unrecorded rounds (sides in the order given), then `rounds` recorded ones in
    ABBA order (`round_order`).

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
    for i in range(rounds):
        for name in round_order(list(sides), i):
            settle()
            for metric, value in sides[name]().items():
                samples[name].setdefault(metric, []).append(float(value))
            done += 1
            if progress is not None:
                progress(done, name)
    return samples
