"""Server-side turn detection for a /v1/realtime session: `turn_detection: {"type": "server_vad", ...}`.

The plan's voice activity detector is a graph node (a `silero_vad` node fed by a client-fed stream,
run per chunk by a task of its own: graphs/qwen3_omni.yaml's `vad`, `user_pcm`, `detect_speech`).
While turn detection is on, the session keeps one request of that task open: every append is
resampled to the detector's 16 kHz and cut into its 512-sample windows, which go into the stream at
once; the detector's probabilities come back window by window and drive the turn, in audio time
(window k is the session's audio from k * 32 ms), never in wall time:

  idle      a window at or over `threshold` starts speech: `speech_started` (audio_start_ms = that
            window's start less `prefix_padding_ms`); the utterance (realtime_utterance.py) opens with
            the padding audio, kept for it since
  speaking  every window heard goes on into the utterance; a window under `threshold - 0.15` (Silero's
            own hysteresis) starts a silence, one at or over `threshold` ends it; a silence of
            `silence_duration_ms` ends speech: `speech_stopped` (audio_end_ms = where the silence
            began), the utterance is committed, its silence included, and, with `create_response`,
            answered. An utterance at the model's audio limit ends there.
Speech starting while a response plays cancels it (`interrupt_response`, barge-in). Appends cancel
nothing by themselves: a client streams its microphone through the answer.
Audio the detector has not yet judged waits here; audio it judged silent is kept only as far back as
the padding reaches. A detector request that fails is an `error` event; the next append opens another
(what the failed one had not judged is skipped). A turn whose utterance finds the server full is an
`error` event (429) and is dropped; detection goes on.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import torch

from runtime.conductor.config import QueueFull
from runtime.entrypoints.http.audio_decode import PCM_RATE, StreamResampler, pcm16_samples
from runtime.entrypoints.http.context import ServerContext
from runtime.entrypoints.http.errors import ApiError, event_error
from runtime.entrypoints.http.schemas import TurnDetection
from runtime.entrypoints.http.speech import speech_params
from runtime.entrypoints.http.speech_detector import SpeechDetector

log = logging.getLogger(__name__)
HYSTERESIS = 0.15             # speech ends below threshold - this (Silero's VADIterator)


class Turns(Protocol):
    """What the detector tells its session (realtime_session.py)."""

    async def speech_started(self, audio_start_ms: int, item_id: str, pcm16: bytes) -> None: ...
    async def speech_audio(self, pcm16: bytes) -> bool:
        """More of the utterance; False when it would pass the model's audio limit (not taken)."""
    async def speech_stopped(self, audio_end_ms: int, item_id: str) -> None: ...
    def judged(self) -> None:
        """One more window judged (counted on /metrics)."""
    async def failed(self, err: ApiError) -> None: ...


class TurnDetector:
    """One session's server VAD (module docstring)."""

    def __init__(self, server: ServerContext, detector: SpeechDetector, settings: TurnDetection,
                 turns: Turns, new_item_id: Any) -> None:
        self.server, self.detector, self.settings, self.turns = server, detector, settings, turns
        self._new_item_id = new_item_id
        self._resampler = StreamResampler(PCM_RATE, detector.sample_rate)
        self._tail = torch.zeros(0)                  # detector-rate samples short of a window
        per_window = detector.window * PCM_RATE / detector.sample_rate
        if per_window != int(per_window):
            raise ValueError(f"a {detector.window}-sample window at {detector.sample_rate} Hz is no whole "
                             f"number of {PCM_RATE} Hz samples")
        self._pcm_per_window = int(per_window)
        self._padding = settings.prefix_padding_ms * PCM_RATE // 1000
        self._pending = bytearray()                  # session audio from sample `_pending_start` on
        self._pending_start = 0
        self._forwarded = 0                          # the utterance has the audio up to this sample
        self._window = 0                             # the next window whose probability comes back
        self._sent = 0                               # windows sent to the detector
        self.speaking = False
        self.item_id = ""
        self._silent_since: int | None = None        # the window a silence in speech began
        self.req: Any = None
        self._reader: asyncio.Task[None] | None = None

    async def push(self, pcm16: bytes) -> None:
        """Session audio (24 kHz pcm16): kept until judged, its whole windows sent to the detector."""
        if self.req is None or self.req.state.is_final:
            self._open()
        self._pending += pcm16
        wave = torch.cat((self._tail, self._resampler.push(pcm16_samples(pcm16))))
        whole = wave.shape[0] // self.detector.window * self.detector.window
        self._tail = wave[whole:]
        windows = wave[:whole].reshape(-1, self.detector.window)
        if windows.shape[0]:
            self._sent += windows.shape[0]
            await self.server.conductor.push_stream(self.req, self.detector.stream, [{"value": w} for w in windows])

    def _open(self) -> None:
        """The detector's request, at the session's first append or after the last one failed (an `error` event
        said so): windows sent to a failed one are not judged, and speech in progress ends unheard."""
        if self.req is not None:
            self.end_speech()
            self._window = self._sent
            self._trim(self._window * self._pcm_per_window - self._padding)
        self.req = self.server.conductor.submit(self.detector.task, speech_params(self.server, {}, {}), [])
        self._reader = asyncio.ensure_future(self._read())

    def end_speech(self) -> None:
        """The client committed or cleared the buffer itself: the detector is idle again."""
        self.speaking, self._silent_since = False, None

    def close(self) -> None:
        """Turn detection off, or the session closed: the detector's request is freed now."""
        if self.req is not None:
            self.server.conductor.abort(self.req)
            self._reader.cancel()
            self.req = None

    async def _read(self) -> None:
        try:
            while True:
                event = await self.req.events.get()
                if event.finish_reason == "error":
                    raise event_error(event, "voice activity detection")
                probs = event.tensors.get(self.detector.key)
                for p in probs.tolist() if probs is not None else []:
                    try:
                        await self._judge(float(p))
                    except QueueFull as exc:       # the turn's utterance found no room: this turn is lost
                        self.end_speech()
                        await self.turns.failed(ApiError(429, f"the server is at capacity: {exc}; the turn was "
                                                              "dropped", code="queue_full"))
                if event.finish_reason is not None:
                    raise ApiError(500, f"voice activity detection ended ({event.finish_reason})", code="server_error")
        except asyncio.CancelledError:
            raise
        except ApiError as err:
            await self.turns.failed(err)
        except Exception:          # a bug here must reach the client and the log, not end detection quietly
            log.exception("turn detection failed")
            await self.turns.failed(ApiError(500, "turn detection failed (see the server's log)", code="server_error"))

    async def _judge(self, p: float) -> None:
        """One window's probability (module docstring's states)."""
        k, self._window = self._window, self._window + 1
        self.turns.judged()
        end = (k + 1) * self._pcm_per_window                # the window's end, in session samples
        threshold = self.settings.threshold
        if not self.speaking and p >= threshold:
            self.speaking, self._silent_since, self.item_id = True, None, self._new_item_id()
            start = max(self._pending_start, k * self._pcm_per_window - self._padding)
            self._forwarded = end
            await self.turns.speech_started(round(start * 1000 / PCM_RATE), self.item_id, self._audio(start, end))
        elif self.speaking:
            if p >= threshold:
                self._silent_since = None
            elif p < threshold - HYSTERESIS and self._silent_since is None:
                self._silent_since = k
            if not await self.turns.speech_audio(self._audio(self._forwarded, end)):
                await self._stop(k)
                return
            self._forwarded = end
            silence = k + 1 - self._silent_since if self._silent_since is not None else 0
            if silence * self.detector.window_ms >= self.settings.silence_duration_ms:
                await self._stop(self._silent_since)
                return
        self._trim(self._forwarded if self.speaking else end - self._padding)

    async def _stop(self, silent_from: int) -> None:
        self.end_speech()
        self._trim(self._forwarded)
        await self.turns.speech_stopped(round(silent_from * self.detector.window_ms), self.item_id)

    def _audio(self, start: int, end: int) -> bytes:
        return bytes(self._pending[2 * (start - self._pending_start): 2 * (end - self._pending_start)])

    def _trim(self, keep_from: int) -> None:
        drop = max(0, keep_from - self._pending_start)
        if drop:
            del self._pending[: 2 * drop]
            self._pending_start += drop
