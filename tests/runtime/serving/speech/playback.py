"""A client that streams speech over SSE: each `speech.audio.delta` event is one decoded chunk.

The tests check what arrives, never when: whether streams play without gaps in real time
depends on the machine and is measured by `tools/bench.py speech` (its listener model is
tools/bench/playback.py).
"""
from __future__ import annotations

import asyncio
import base64
import http.client
import json
from typing import Callable
from dataclasses import dataclass, field

import aiohttp


@dataclass
class Received:
    """What one streamed request delivered."""

    pcm: list[bytes] = field(default_factory=list)           # each chunk's 16-bit PCM
    done: dict = field(default_factory=dict)                 # the `speech.audio.done` event


async def stream_speech(session: aiohttp.ClientSession, url: str, body: dict) -> Received:
    got = Received()
    async with session.post(f"{url}/v1/audio/speech", json={**body, "stream_format": "sse"}) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if not line.startswith(b"data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "speech.audio.delta":
                got.pcm.append(base64.b64decode(event["audio"]))
            elif event["type"] == "speech.audio.done":
                got.done = event
    return got


def stream_many(url: str, bodies: list[dict]) -> list[Received]:
    """Stream every body concurrently; each result in the order of `bodies`."""
    async def run() -> list[Received]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            return await asyncio.gather(*[stream_speech(session, url, b) for b in bodies])
    return asyncio.run(run())


def sse_events(port: int, body: dict, on_first_audio: Callable[[], None] | None = None) -> list[dict]:
    """The SSE events of one speech request, read line by line; `on_first_audio()` runs when the
    first chunk arrives, before the rest is read."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/audio/speech", json.dumps({**body, "stream_format": "sse"}),
                 {"Content-Type": "application/json"})
    resp, events = conn.getresponse(), []
    for line in resp:
        if line.startswith(b"data: "):
            events.append(json.loads(line[6:]))
            if on_first_audio and events[-1]["type"] == "speech.audio.delta" and len(events) == 1:
                on_first_audio()
    conn.close()
    return events
