"""How far this process's worker start has come, for its heartbeat (read from another thread).

A rank's start can take minutes (weights read, decode steps compiled per batch bucket on CPU,
CUDA graphs captured): the conductor waits for its Ready as long as the rank keeps making
progress, and gives up only after `--ready-timeout` seconds without a step
(runtime/ranks/start_watch.py). Loading code calls `advance(what)` after each step.
"""
from __future__ import annotations

import threading

_lock = threading.Lock()
_steps = 0
_last = ""


def advance(what: str) -> None:
    """One more start step done (`what`: said in the conductor's error if the next one never comes)."""
    global _steps, _last
    with _lock:
        _steps += 1
        _last = what


def snapshot() -> tuple[int, str]:
    """(steps done, the last one) so far."""
    with _lock:
        return _steps, _last
