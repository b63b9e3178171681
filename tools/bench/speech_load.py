"""A burst of concurrent streamed speech requests against one server, timed per stream.

Every body is POSTed at once to `/v1/audio/speech` with `stream_format: sse` and
`response_format: pcm` (aiohttp, one connection each); each `speech.audio.delta` event
is one decoded chunk of 16-bit PCM. Per stream: the time from its send to its first
audio bytes (time to first audio, TTFA), the samples received, the number of chunks and
the tokens the server reports in `speech.audio.done`. The burst's wall time runs from
the first send to the last event.
"""
from __future__ import annotations

import asyncio
import base64
import json
import statistics
import time
from dataclasses import dataclass
from typing import Sequence

import aiohttp


@dataclass(frozen=True)
class StreamResult:
    """What one streamed request delivered."""

    first_audio_s: float     # send -> first audio bytes
    samples: int             # audio samples received
    chunks: int              # speech.audio.delta events
    output_tokens: int       # from the done event's usage


@dataclass(frozen=True)
class SpeechBurst:
    streams: list[StreamResult]
    wall_s: float            # first send -> last stream done

    def metrics(self, sample_rate: int) -> dict[str, float]:
        """Median TTFA (s); RTF = wall time / mean seconds of audio per stream; the least audio and chunks."""
        mean_audio_s = statistics.mean(s.samples for s in self.streams) / sample_rate
        return {"ttfa": statistics.median(s.first_audio_s for s in self.streams),
                "rtf": self.wall_s / mean_audio_s, "samples": float(min(s.samples for s in self.streams)),
                "chunks": float(min(s.chunks for s in self.streams)),
                "max_chunks": float(max(s.chunks for s in self.streams)),
                "tokens": float(min(s.output_tokens for s in self.streams))}


async def _one(session: aiohttp.ClientSession, url: str, body: dict) -> StreamResult:
    start, first, samples, chunks, tokens = time.perf_counter(), None, 0, 0, -1
    async with session.post(url + "/v1/audio/speech",
                            json={**body, "stream_format": "sse", "response_format": "pcm"}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}/v1/audio/speech: HTTP {resp.status}: {(await resp.text())[:300]}")
        async for line in resp.content:
            if not line.startswith(b"data: "):
                continue
            event = json.loads(line[6:])
            if event.get("type") == "speech.audio.delta":
                first = time.perf_counter() - start if first is None else first
                samples, chunks = samples + len(base64.b64decode(event["audio"])) // 2, chunks + 1
            elif event.get("type") == "speech.audio.done":
                tokens = int(event["usage"]["output_tokens"])
            else:
                raise RuntimeError(f"{url}/v1/audio/speech streamed an error: {str(event)[:300]}")
    if first is None or tokens < 0:
        raise RuntimeError(f"{url}/v1/audio/speech ended without audio or without its done event")
    return StreamResult(first, samples, chunks, tokens)


async def _burst(url: str, bodies: Sequence[dict]) -> SpeechBurst:
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()
        done = await asyncio.gather(*(_one(session, url, b) for b in bodies))
        return SpeechBurst(list(done), time.perf_counter() - start)


def speech_burst(url: str, bodies: Sequence[dict]) -> SpeechBurst:
    """Stream every body at once from `url` and wait for all of them (RuntimeError when one fails)."""
    try:
        return asyncio.run(_burst(url, bodies))
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise RuntimeError(f"{url}/v1/audio/speech: {type(exc).__name__}: {exc}") from exc
