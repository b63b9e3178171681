"""A simulated real-time listener per speech stream: underruns from chunk arrival times.

Playback starts with the first chunk and runs at real time; a chunk that arrives after
everything before it has been played is an underrun (the listener hears a gap of the
lateness), and playback resumes from that chunk. This is the one definition of an
underrun for measured streams (the speech suite); the conductor's own playback clock
(runtime/streams/deadline.py) is what the server schedules by.
"""
from __future__ import annotations

from typing import Mapping, Sequence


def underruns(arrivals: Sequence[float], seconds: Sequence[float], min_gap_s: float = 0.0) -> list[float]:
    """How late each late chunk was (s): `arrivals[i]` is when chunk i arrived (any clock, seconds,
    non-decreasing), `seconds[i]` how long it plays. A gap of `min_gap_s` or less is waited out but not
    counted (vLLM-Omni counts only gaps over 0.1 s)."""
    if len(arrivals) != len(seconds):
        raise ValueError(f"{len(arrivals)} arrival times for {len(seconds)} chunks: one of each per chunk")
    late: list[float] = []
    played_until: float | None = None
    for t, length in zip(arrivals, seconds):
        if played_until is not None and t - played_until > min_gap_s:
            late.append(t - played_until)
        played_until = (t if played_until is None else max(played_until, t)) + length
    return late


def held_in_real_time(streams_underrun: Mapping[int, int]) -> int:
    """The largest concurrency N whose streams all played without an underrun, counting only N
    below which every measured concurrency did too (a gap-free 32 after a gapped 16 is luck,
    not capacity); 0 when the smallest measured N already had one. `streams_underrun` maps
    each measured N to how many of its streams had an underrun."""
    held = 0
    for n in sorted(streams_underrun):
        if streams_underrun[n] > 0:
            break
        held = n
    return held
