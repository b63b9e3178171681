"""Wait for a quiet machine before each measured run: a side's threads can keep a core busy
after its run has answered, and the next side would pay for it.

Found on vLLM's CPU build: its OpenMP threads spin for a while after a request completes (the
runtime's default block time), so a 256-token prompt sent to mstar right after one sent to vLLM
took a median 374 ms against 273 ms after a one-second pause, while vLLM right after mstar lost
nothing (mstar's workers wait passively): back-to-back alternation handed vLLM a head start.
`wait_quiet` reads the kernel's CPU counters (/proc/stat) and returns once the whole machine
was at least `1 - BUSY` idle over one `WINDOW_S` window, or after `timeout_s` on a machine that
never gets quiet (its load is then in the figures, as it always was; the waits are recorded).
"""
from __future__ import annotations

import time
from pathlib import Path

BUSY = 0.10          # at most this fraction of all cores busy over a window: the machine is quiet
WINDOW_S = 0.1       # one window (libgomp / Intel OpenMP block times are ~0.2 s: a spin spans windows)
TIMEOUT_S = 3.0      # give up waiting (a loaded machine): measure anyway
STAT = Path("/proc/stat")


def cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot, or None where /proc/stat is missing."""
    try:
        fields = [int(v) for v in STAT.read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)     # idle + iowait
    total = sum(fields[:8])                                        # guest time is already in user
    return total - idle, total


def wait_quiet(timeout_s: float = TIMEOUT_S) -> float:
    """Seconds waited until one quiet window ended (`timeout_s` if none came; 0 without /proc/stat)."""
    start = time.monotonic()
    before = cpu_times()
    if before is None or timeout_s <= 0:
        return 0.0
    while True:
        time.sleep(WINDOW_S)
        after = cpu_times()
        busy, total = after[0] - before[0], after[1] - before[1]
        waited = time.monotonic() - start
        if (total > 0 and busy <= BUSY * total) or waited >= timeout_s:
            return min(waited, timeout_s)
        before = after
