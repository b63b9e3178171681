"""Deadline bookkeeping for audio streams and the earliest-deadline-first order."""
from __future__ import annotations

import random

from runtime.streams.deadline import PlaybackClock, by_deadline


def test_deadline_before_and_after_first_chunk():
    clock = PlaybackClock(arrival_s=10.0, first_audio_target_s=0.5)
    assert clock.deadline() == 10.5
    clock.on_chunk_sent(now=10.2, audio_s=0.3)
    assert clock.deadline() == 10.2 + 0.3
    clock.on_chunk_sent(now=10.4, audio_s=0.3)  # in time: no underrun
    # float64 sums of decimal seconds (10.4 + 0.3 is not 10.8 in binary): a rounding or two of ulp 1.8e-15; measured
    # 1.8e-15
    assert clock.num_underruns == 0 and abs(clock.deadline() - 10.8) < 1e-9


def test_late_chunk_counts_an_underrun_and_shifts_playback():
    clock = PlaybackClock(arrival_s=0.0)
    clock.on_chunk_sent(now=0.1, audio_s=0.2)   # runs dry at 0.3
    clock.on_chunk_sent(now=0.5, audio_s=0.2)   # 0.2 s late
    assert clock.num_underruns == 1
    assert abs(clock.deadline() - 0.7) < 1e-9   # resumes at 0.5, plays 0.2 s (float64 sums: a rounding of 1e-16)


def test_the_stream_closest_to_running_dry_goes_first():
    ahead = PlaybackClock(arrival_s=0.0, first_chunk_s=0.0, audio_sent_s=5.0)
    behind = PlaybackClock(arrival_s=1.0, first_chunk_s=1.0, audio_sent_s=0.4)
    waiting = PlaybackClock(arrival_s=2.0, first_audio_target_s=1.0)
    assert by_deadline({"a": ahead, "b": behind, "w": waiting}) == ["b", "w", "a"]


def simulate(order) -> dict[str, PlaybackClock]:
    """Simulated rank: one chunk (0.5 s of audio, 0.1 s of compute) per tick, 4 streams."""
    rng = random.Random(0)
    clocks = {f"r{i}": PlaybackClock(arrival_s=rng.uniform(0, 0.3)) for i in range(4)}
    now = 0.0
    while now < 20.0:
        live = {rid: c for rid, c in clocks.items() if c.arrival_s <= now}
        if live:
            rid = order(live)[0]
            now += 0.1
            clocks[rid].on_chunk_sent(now, audio_s=0.5)
        else:
            now += 0.01
    return clocks


def test_edf_keeps_every_stream_playing_when_capacity_allows():
    """5 s of audio per second of compute for 4 real-time streams: EDF never runs one dry."""
    clocks = simulate(by_deadline)
    assert all(c.num_underruns == 0 for c in clocks.values())
    assert all(c.audio_sent_s > 15 for c in clocks.values())


def test_first_come_first_served_starves_later_streams():
    """The same load served in arrival order: the check above would catch it."""
    clocks = simulate(lambda live: sorted(live, key=lambda rid: live[rid].arrival_s))
    assert min(c.audio_sent_s for c in clocks.values()) == 0.0
