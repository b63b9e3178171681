"""Metrics of streamed audio and of what the ranks hold, on the server's /metrics.

Per audio request (observed by the HTTP handler that writes the chunks): time to first
audio, real-time factor (wall time from arrival to the last chunk / seconds of audio;
< 1 is faster than real time), seconds of audio, and playback underruns — a chunk sent
after a client playing in real time from its first chunk would have run dry.

Scraped from the conductor at collection time: KV blocks each rank's nodes hold and the
stream buffers held on workers (from heartbeats) and in the conductor's mirrors; both go
back to zero when requests end, including on abort and client disconnect.

Per /v1/realtime server: sessions open, encoder windows of the utterance's client-fed stream
heard before the commit ("streamed") and after it ("commit"), responses cancelled, error
events by code; with server VAD, the detector's windows judged and the turns committed, by who ended
them ("server_vad" or the client's "commit").
"""
from __future__ import annotations

from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
_RTF = (0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 5, 10)


class AudioMetrics:
    """Histograms and counters the audio handlers update."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.time_to_first_audio = Histogram("mstar_audio_time_to_first_audio_seconds",
                                             "arrival to the first audio chunk sent", buckets=_SECONDS,
                                             registry=registry)
        self.real_time_factor = Histogram("mstar_audio_real_time_factor",
                                          "wall time arrival->last chunk / seconds of audio", buckets=_RTF,
                                          registry=registry)
        self.audio_seconds = Histogram("mstar_audio_seconds", "seconds of audio per request", buckets=_SECONDS,
                                       registry=registry)
        self.underruns = Counter("mstar_audio_stream_underruns", "chunks that arrived after real-time playback "
                                 "would have run dry", registry=registry)
        self.chunks = Counter("mstar_audio_chunks", "audio chunks sent", registry=registry)
        self.text_clauses = Counter("mstar_speech_stream_clauses", "clauses of streamed text released for speech "
                                    "(/v1/audio/speech/stream)", registry=registry)
        self.speech_stream_sessions = Gauge("mstar_speech_stream_sessions", "/v1/audio/speech/stream sessions open",
                                            registry=registry)


class RuntimeCollector:
    """Gauges read from the conductor when /metrics is scraped."""

    def __init__(self, conductor: Any) -> None:
        self.conductor = conductor

    def collect(self) -> Iterator[GaugeMetricFamily]:
        kv = GaugeMetricFamily("mstar_worker_kv_used_blocks", "KV blocks held per rank and node (worker view)",
                               labels=["rank", "node"])
        buffers = GaugeMetricFamily("mstar_stream_buffers", "per-request stream buffers held",
                                    labels=["where"])
        worker_buffers = 0
        for rank, beat in sorted(self.conductor.worker_stats.items()):
            for node, blocks in sorted(beat.kv_used_blocks.items()):
                kv.add_metric([str(rank), node], blocks)
            worker_buffers += beat.stream_buffers
        buffers.add_metric(["workers"], worker_buffers)
        buffers.add_metric(["conductor"], self.conductor.streams.num_buffers)
        yield kv
        yield buffers


class RealtimeMetrics:
    """The /v1/realtime metrics (module docstring)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.sessions = Gauge("mstar_realtime_sessions", "realtime sessions open", registry=registry)
        self.windows = Counter("mstar_realtime_audio_windows", "audio encoder windows heard per phase: "
                               "streamed (encoded before the commit, while the user spoke) or commit (after it)",
                               ["phase"], registry=registry)
        for phase in ("streamed", "commit"):     # exported at 0 from the start
            self.windows.labels(phase)
        self.cancelled = Counter("mstar_realtime_responses_cancelled", "responses cancelled (response.cancel "
                                 "or barge-in)", registry=registry)
        self.errors = Counter("mstar_realtime_error_events", "error events sent, by code", ["code"],
                              registry=registry)
        self.vad_windows = Counter("mstar_realtime_vad_windows", "windows the voice activity detector judged "
                                   "(32 ms each for Silero VAD)", registry=registry)
        self.turns = Counter("mstar_realtime_turns", "utterances committed, by who ended them: the server's "
                             "turn detection (server_vad) or the client (commit)", ["by"], registry=registry)
        for by in ("server_vad", "commit"):
            self.turns.labels(by)
