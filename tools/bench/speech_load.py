"""A burst of concurrent streamed speech requests against one server, timed per stream.

Every body is POSTed at once to `/v1/audio/speech` with `stream_format: sse` and
`response_format: pcm` (aiohttp, one connection each); each `speech.audio.delta` event
is one decoded chunk of 16-bit PCM. Per stream: when each chunk arrived (seconds after its
send; the first is the time to first audio, TTFA), the samples in each chunk and the
tokens the server reports in `speech.audio.done`. The burst's wall time runs from the
first send to the last event.
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

    arrivals: tuple[float, ...]      # send -> each speech.audio.delta event (s)
    chunk_samples: tuple[int, ...]   # audio samples in each of those chunks
    output_tokens: int               # from the done event's usage

    @property
    def first_audio_s(self) -> float:
        return self.arrivals[0]

    @property
    def samples(self) -> int:
        return sum(self.chunk_samples)

    @property
    def chunks(self) -> int:
        return len(self.chunk_samples)


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
    start, arrivals, chunk_samples, tokens = time.perf_counter(), [], [], -1
    async with session.post(url + "/v1/audio/speech",
                            json={**body, "stream_format": "sse", "response_format": "pcm"}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}/v1/audio/speech: HTTP {resp.status}: {(await resp.text())[:300]}")
        async for line in resp.content:
            if not line.startswith(b"data: "):
                continue
            event = json.loads(line[6:])
            if event.get("type") == "speech.audio.delta":
                arrivals.append(time.perf_counter() - start)
                chunk_samples.append(len(base64.b64decode(event["audio"])) // 2)
            elif event.get("type") == "speech.audio.done":
                tokens = int(event["usage"]["output_tokens"])
            else:
                raise RuntimeError(f"{url}/v1/audio/speech streamed an error: {str(event)[:300]}")
    if not arrivals or tokens < 0:
        raise RuntimeError(f"{url}/v1/audio/speech ended without audio or without its done event")
    return StreamResult(tuple(arrivals), tuple(chunk_samples), tokens)


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
