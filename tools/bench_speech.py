"""Streamed-speech load test: N concurrent /v1/audio/speech streams, played back in real time.

    python tools/bench_speech.py --url http://127.0.0.1:8000 --model orpheus-3b --voice tara \
        --concurrency 8 [--extra '{"max_tokens": 70}']

Each stream uses SSE (`speech.audio.delta` = one decoded chunk). A simulated listener
starts playing at the first chunk, at real time; a chunk that arrives after everything
before it was played is an underrun. Prints time to first audio (p50 / max), the
per-stream real-time factor (arrival -> last chunk over seconds of audio), underruns and
aggregate seconds of audio per wall second.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import time

import aiohttp

SAMPLE_RATE = 24000


async def _stream(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[float, list[tuple[float, float]]]:
    """(submit time, [(arrival, seconds of audio)] per chunk)."""
    start, chunks = time.monotonic(), []
    async with session.post(f"{url}/v1/audio/speech", json={**body, "stream_format": "sse"}) as resp:
        resp.raise_for_status()
        async for line in resp.content:
            if line.startswith(b"data: "):
                event = json.loads(line[6:])
                if event["type"] == "speech.audio.delta":
                    chunks.append((time.monotonic(), len(base64.b64decode(event["audio"])) / 2 / SAMPLE_RATE))
    return start, chunks


def _underruns(chunks: list[tuple[float, float]]) -> int:
    count, played_until = 0, None
    for arrival, seconds in chunks:
        if played_until is not None and arrival > played_until:
            count += 1
        played_until = max(played_until or arrival, arrival) + seconds
    return count


async def run(args: argparse.Namespace) -> dict:
    extra = json.loads(args.extra)
    bodies = [{"model": args.model, "voice": args.voice, "input": f"Sentence number {i}.", "seed": i,
               "response_format": "pcm", **extra} for i in range(args.concurrency)]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        begin = time.monotonic()
        results = await asyncio.gather(*[_stream(session, args.url, b) for b in bodies])
        wall = time.monotonic() - begin
    ttfa = [chunks[0][0] - start for start, chunks in results]
    audio = [sum(s for _, s in chunks) for _, chunks in results]
    rtf = [(chunks[-1][0] - start) / a for (start, chunks), a in zip(results, audio)]
    return {"streams": args.concurrency, "ttfa_p50_s": statistics.median(ttfa), "ttfa_max_s": max(ttfa),
            "rtf_p50": statistics.median(rtf), "rtf_max": max(rtf),
            "underruns": sum(_underruns(chunks) for _, chunks in results),
            "streams_with_underruns": sum(1 for _, chunks in results if _underruns(chunks)),
            "audio_s": sum(audio), "wall_s": wall, "audio_s_per_wall_s": sum(audio) / wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", required=True)
    p.add_argument("--voice", default="alloy")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--extra", default="{}", help="JSON merged into every request body")
    print(json.dumps(asyncio.run(run(p.parse_args())), indent=1))


if __name__ == "__main__":
    main()
