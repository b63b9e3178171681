"""A worker's OpenMP threads: how idle ones wait, and how many run while other processes take cores.

torch's CPU wheel runs its intra-op threads on GNU OpenMP. A decode step is some hundred short
parallel regions (each GEMM, each fused kernel), a few microseconds to a millisecond apart, so
how a thread waits between them decides much of the step:

* Sleeping at once (OMP_WAIT_POLICY=PASSIVE) costs a futex wake-up per region. On a KVM guest
  that halved SmolLM2's served chat throughput against brief spinning (`bench.py threads`;
  docs/benchmark-log.md).
* Spinning for long (libgomp's default) is what a neighbour punishes: while another process
  holds one of the cores, a region waits for its descheduled thread a whole time slice, and the
  spinners burn theirs (beside one busy process, spinning threads ran slower than sleeping ones
  and than a single thread).

So a worker spins briefly (`SPIN_COUNT` iterations, a few milliseconds: longer than the gaps
inside a step and the conductor's round trip between steps) and a `ThreadGovernor` runs as many
threads as there are cores nobody else keeps busy: between batches it reads the machine's busy
time (/proc/stat, steal included: a hypervisor's other guests are neighbours too) less this
process's own, and when other processes held a core through two windows in a row it drops a
thread; when they let go it takes it back. With one thread per free core no region waits for
a descheduled thread, so a neighbour costs in proportion to the cores it takes. Every change is
logged and the worker's current count is in /metrics (`mstar_worker_threads`): a slower mode,
never a silent one. A user's OMP_WAIT_POLICY or GOMP_SPINCOUNT is kept as given.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, MutableMapping

log = logging.getLogger(__name__)

# libgomp's spin iterations before an idle thread sleeps: a `pause` each, ~65 cycles on AMD Zen 2..5 and ~140
# on Intel since Skylake, so 2.5-6 ms at 2.5 GHz: longer than the gaps inside a decode step. The smallest of the
# counts tried that served as fast as spinning forever (docs/benchmark-log.md)
SPIN_COUNT = "100000"
WINDOW_S = 0.5            # the shortest span the governor measures others' load over
AGREE = 2                 # windows in a row that must ask for the same count before it changes
GAP_S = 2.0               # a batch starting this long after the one before ended: the worker sat idle, and the window
                          # (others' load while it waited) says nothing about the batches to come: it restarts,
                          # and only windows of work count (a count asked for before the gap still counts)
PROC_STAT = "/proc/stat"


def worker_waits(environ: MutableMapping[str, str]) -> bool:
    """Idle OpenMP threads spin `SPIN_COUNT` iterations, then sleep, unless the user chose a wait policy
    (OMP_WAIT_POLICY or GOMP_SPINCOUNT); True if this set it. Only works before torch is imported."""
    if "torch" in sys.modules:
        log.warning("torch was imported before the worker's OpenMP settings: idle threads keep libgomp's "
                    "default spin (set GOMP_SPINCOUNT=%s in the environment instead)", SPIN_COUNT)
        return False
    if "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return False
    environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    return True


def machine_busy_s() -> float:
    """CPU seconds every process on the machine has run (user, nice, system, irq, softirq, steal: all CPUs)."""
    with open(PROC_STAT) as f:
        fields = f.readline().split()
    if not fields or fields[0] != "cpu":
        raise OSError(f"{PROC_STAT} does not start with the cpu totals line")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_busy_s() -> float:
    """CPU seconds this process has run, all its threads."""
    t = os.times()
    return t.user + t.system


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:       # no affinity call on this OS
        return os.cpu_count() or 1


def wanted_threads(others: float, cores: int, allotted: int) -> int:
    """Threads for the cores nobody else keeps busy: `cores` less the cores others used (rounded to the
    nearest whole core), within 1 .. allotted."""
    free = int(cores - others + 0.5)
    return max(1, min(allotted, free))


@dataclass
class _Sample:
    at: float
    machine: float
    own: float


class ThreadGovernor:
    """Sets the worker's thread count from other processes' load, between batches (module doc).

    `allotted`: the threads the worker was given; `apply` sets a count (torch.set_num_threads:
    libgomp's count for the calling thread, which both torch's ops and the fused kernels use).
    Where /proc/stat cannot be read, or `fixed` gives a reason, the count stays at `allotted` and `state`
    says why."""

    def __init__(self, allotted: int, apply: Callable[[int], None], cores: int | None = None,
                 window_s: float = WINDOW_S, fixed: str = "") -> None:
        self.allotted, self.threads, self._apply = allotted, allotted, apply
        self.cores = cores or usable_cores()
        self.window_s = window_s
        self.others = 0.0                 # cores other processes used over the last window
        self.changes = 0
        self._pending: tuple[int, int] | None = None     # (count asked for, windows in a row)
        self.state = f"fixed: {fixed}" if fixed else "fixed: one thread" if allotted <= 1 else ""
        self._last: _Sample | None = None
        self._ended = time.monotonic()        # when the last batch ended
        if not self.state:
            try:
                self._last = self._sample()
            except OSError as exc:
                self.state = f"fixed at {allotted}: {exc}"
                log.warning("the worker's thread count stays at %d whatever other processes run (%s)", allotted, exc)

    def _sample(self) -> _Sample:
        return _Sample(time.monotonic(), machine_busy_s(), own_busy_s())

    def after_batch(self, started: float | None = None) -> None:
        """Measure the window that just ended, if it is long enough, and change the count if two agree.
        `started`: when the batch began (time.monotonic()), so that a long batch is not taken for idleness."""
        ended, self._ended = self._ended, time.monotonic()
        idle = (started if started is not None else self._ended) - ended
        if self._last is None or self._ended - self._last.at < self.window_s:
            return
        try:
            now = self._sample()
        except OSError:
            return
        if idle > GAP_S:                      # idle before this batch: measure from here on
            self._last = now
            return
        span = now.at - self._last.at
        self.others = max(0.0, (now.machine - self._last.machine) - (now.own - self._last.own)) / span
        self._last = now
        want = wanted_threads(self.others, self.cores, self.allotted)
        if want == self.threads:
            self._pending = None
            return
        count = self._pending[1] + 1 if self._pending and self._pending[0] == want else 1
        self._pending = (want, count)
        if count >= AGREE:
            self._set(want)

    def _set(self, threads: int) -> None:
        level = logging.WARNING if threads < self.threads else logging.INFO
        log.log(level, "other processes kept %.1f of %d cores busy: %d of the worker's %d threads run",
                self.others, self.cores, threads, self.allotted)
        self.threads, self._pending = threads, None
        self.changes += 1
        self._apply(threads)
