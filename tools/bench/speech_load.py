"""A burst of concurrent streamed speech requests against one server, timed per stream: the speech load generator.

    python tools/bench/speech_load.py --url http://127.0.0.1:8000 --model orpheus-3b --voice tara \
        --concurrency 8 [--extra '{"max_tokens": 70}']

Every body is POSTed at once to `/v1/audio/speech` with `stream_format: sse` and
`response_format: pcm` (aiohttp, one connection each); each `speech.audio.delta` event
is one decoded chunk of 16-bit PCM. Per stream: when each chunk arrived (seconds after its
send; the first is the time to first audio, TTFA), the samples in each chunk and the
tokens the server reports in `speech.audio.done`. The burst's wall time runs from the
first send to the last event. Every stream gets a simulated real-time listener
(bench/playback.py): a chunk that arrives after everything before it has played is an underrun.
The command line prints the burst's metrics and its listeners' as JSON.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence, TypeVar

import aiohttp

if __name__ == "__main__":   # run as a script: `bench` is the package this file lives in
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from bench.openai_load import sse_json  # noqa: E402
from bench.playback import underruns  # noqa: E402

R = TypeVar("R")
SAMPLE_RATE = 24000   # Orpheus' SNAC and Qwen3-Omni's code2wav both decode 24 kHz


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
        async for event in sse_json(resp):
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


async def _gathered(one: Callable[[aiohttp.ClientSession, Any], Awaitable[R]], items: Sequence[Any],
                    timeout_s: float) -> tuple[list[R], float]:
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()
        done = await asyncio.gather(*(one(session, item) for item in items))
        return list(done), time.perf_counter() - start


def concurrent_streams(one: Callable[[aiohttp.ClientSession, Any], Awaitable[R]], items: Sequence[Any], where: str,
                       timeout_s: float = 1800.0) -> tuple[list[R], float]:
    """`one(session, item)` for every item at once, on one session with a connection each: the results and the
    seconds from the first send to the last result (RuntimeError naming `where` when a stream fails)."""
    try:
        return asyncio.run(_gathered(one, items, timeout_s))
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise RuntimeError(f"{where}: {type(exc).__name__}: {exc}") from exc


def speech_burst(url: str, bodies: Sequence[dict]) -> SpeechBurst:
    """Stream every body at once from `url` and wait for all of them (RuntimeError when one fails)."""
    streams, wall = concurrent_streams(lambda session, body: _one(session, url, body), bodies,
                                       f"{url}/v1/audio/speech")
    return SpeechBurst(streams, wall)


async def _one_chat(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[StreamResult, float]:
    """One streamed audio chat (`modalities: ["text", "audio"]`, pcm16): its audio as a StreamResult (tokens:
    the completion's text tokens) and the seconds to its first transcript delta (its time to first text)."""
    body = {**body, "modalities": ["text", "audio"], "stream": True, "stream_options": {"include_usage": True}}
    body["audio"] = {"format": "pcm16", **body.get("audio", {})}
    start, arrivals, chunk_samples, ttft, tokens = time.perf_counter(), [], [], None, -1
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}/v1/chat/completions: HTTP {resp.status}: {(await resp.text())[:300]}")
        async for event in sse_json(resp):
            if "error" in event:
                raise RuntimeError(f"{url}/v1/chat/completions streamed an error: {str(event)[:300]}")
            if event.get("usage"):
                tokens = int(event["usage"]["completion_tokens"])
            audio = event["choices"][0]["delta"].get("audio", {}) if event.get("choices") else {}
            if audio.get("data"):
                arrivals.append(time.perf_counter() - start)
                chunk_samples.append(len(base64.b64decode(audio["data"])) // 2)
            elif audio.get("transcript") and ttft is None:
                ttft = time.perf_counter() - start
    if not arrivals or tokens < 0 or ttft is None:
        raise RuntimeError(f"{url}/v1/chat/completions ended without audio, text or usage")
    return StreamResult(tuple(arrivals), tuple(chunk_samples), tokens), ttft


def audio_chat_burst(url: str, bodies: Sequence[dict]) -> tuple[SpeechBurst, list[float]]:
    """Stream every audio chat body at once from `url`: the audio as a SpeechBurst and each stream's time to
    first text (RuntimeError when one fails)."""
    done, wall = concurrent_streams(lambda session, body: _one_chat(session, url, body), bodies,
                                    f"{url}/v1/chat/completions")
    return SpeechBurst([d[0] for d in done], wall), [d[1] for d in done]


def listener_metrics(burst: SpeechBurst, sample_rate: int, min_gap_s: float = 0.0) -> dict[str, float]:
    """Per burst: streams with an underrun (a gap over `min_gap_s`), their total underrun (s), median TTFA (s),
    least and median audio (s; random weights may end a stream early), least chunks."""
    late = [underruns(s.arrivals, [n / sample_rate for n in s.chunk_samples], min_gap_s) for s in burst.streams]
    return {"underrun_streams": float(sum(1 for gaps in late if gaps)), "underrun_s": sum(map(sum, late)),
            "ttfa": statistics.median(s.first_audio_s for s in burst.streams),
            "audio_s": min(s.samples for s in burst.streams) / sample_rate,
            "median_audio_s": statistics.median(s.samples for s in burst.streams) / sample_rate,
            "chunks": float(min(s.chunks for s in burst.streams))}


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", required=True)
    p.add_argument("--voice", default="alloy")
    p.add_argument("--concurrency", type=int, default=8, help="streams sent at once")
    p.add_argument("--extra", default="{}", help="JSON merged into every request body")
    p.add_argument("--sample-rate", type=int, default=SAMPLE_RATE, help="of the model's PCM output (Hz)")
    args = p.parse_args(argv)
    bodies = [{"model": args.model, "voice": args.voice, "input": f"Sentence number {i}.", "seed": i,
               **json.loads(args.extra)} for i in range(args.concurrency)]
    burst = speech_burst(args.url, bodies)
    print(json.dumps({"streams": len(burst.streams), "wall_s": burst.wall_s, **burst.metrics(args.sample_rate),
                      **listener_metrics(burst, args.sample_rate)}, indent=1))


if __name__ == "__main__":
    main()
