"""Playback deadlines of audio streams, for deadline-aware scheduling.

A client plays audio at real time from the moment its first chunk arrives. If a stream
has sent `audio_s` seconds of audio and playback started at `t0`, the client's buffer
runs dry at `t0 + audio_s`: that instant is the stream's deadline. Before its first
chunk, a stream's deadline is its arrival time plus a first-audio target. The conductor
orders audio work by deadline, earliest first (VoxServe's policy), so a stream about to
stall goes before streams that are comfortably ahead.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PlaybackClock:
    """What the conductor knows of one stream's client-side playback."""

    arrival_s: float                       # monotonic time the request arrived
    first_audio_target_s: float = 1.0      # wanted time to first audio
    first_chunk_s: float | None = None     # monotonic time the first chunk was sent
    audio_sent_s: float = 0.0              # seconds of audio sent so far
    num_underruns: int = field(default=0)  # times a chunk was sent after the buffer ran dry

    def deadline(self) -> float:
        """Monotonic time at which the client runs out of audio to play."""
        if self.first_chunk_s is None:
            return self.arrival_s + self.first_audio_target_s
        return self.first_chunk_s + self.audio_sent_s

    def on_chunk_sent(self, now: float, audio_s: float) -> None:
        """Record a chunk of `audio_s` seconds leaving for the client at `now`."""
        if self.first_chunk_s is None:
            self.first_chunk_s = now
        elif now > self.deadline():
            self.num_underruns += 1
            # playback resumes from now: the client waited, so its clock shifts
            self.first_chunk_s += now - self.deadline()
        self.audio_sent_s += audio_s


def by_deadline(clocks: dict[str, PlaybackClock]) -> list[str]:
    """Request ids ordered earliest deadline first (ties by arrival, then id)."""
    return sorted(clocks, key=lambda rid: (clocks[rid].deadline(), clocks[rid].arrival_s, rid))
