"""Text streamed in to speech, as a client behind a still-writing LLM sees it (suite_realtime's rows).

The text arrives a word at a time at WORDS_PER_S (a CPU-served LLM's pace). Streamed: each word is an
`input_text.append` on /v1/audio/speech/stream as it arrives, `input_text.done` after the last; the
graph's `delimited` policy releases clauses and the first clause speaks while the rest is written.
Whole text: the client waits for the last word, then POSTs the text to /v1/audio/speech (streamed PCM),
as a client without a streaming-text endpoint must. Both clocks start at the first word. Greedy
decoding; each streamed clause takes MAX_TOKENS audio tokens, the whole text that many per clause, so
both sides speak as many tokens.
"""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp

TEXT = ("Sure, I can help with that. The weather in Paris is mild today, with a light breeze from the west. "
        "Take a jacket if you go out tonight.")
WORDS_PER_S = 8.0
MAX_TOKENS = 70                     # per clause (the tiny preset's default)
VOICE = "tara"


def _words() -> list[str]:
    words = TEXT.split(" ")
    return [w + " " for w in words[:-1]] + [words[-1]]


async def streamed(url: str, seed: int) -> dict[str, float]:
    """Seconds from the first word to the first audio delta and to `speech.done`; clauses spoken."""
    ws_url = url.replace("http", "ws", 1) + "/v1/audio/speech/stream"
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url) as ws:
        await ws.receive()                                               # session.created
        await ws.send_json({"type": "session.update", "session": {"voice": VOICE, "temperature": 0, "seed": seed,
                                                                  "max_tokens": MAX_TOKENS}})
        start = time.monotonic()
        writer = asyncio.create_task(_write(ws, start))
        first, clauses = None, 0
        async for msg in ws:
            event = json.loads(msg.data)
            if event["type"] == "speech.audio.delta" and first is None:
                first = time.monotonic() - start
            elif event["type"] == "speech.done":
                clauses = event["usage"]["clauses"]
                break
            elif event["type"] == "error":
                raise RuntimeError(f"speech stream error: {event['error']}")
        await writer
        return {"first_audio": first, "done": time.monotonic() - start, "clauses": clauses}


async def _write(ws: aiohttp.ClientWebSocketResponse, start: float) -> None:
    for i, word in enumerate(_words()):
        await asyncio.sleep(max(0.0, start + i / WORDS_PER_S - time.monotonic()))
        await ws.send_json({"type": "input_text.append", "delta": word})
    await ws.send_json({"type": "input_text.done"})


async def whole(url: str, model: str, clauses: int) -> dict[str, float]:
    """The same text POSTed once its last word has arrived: first word to first audio chunk and to the end."""
    start = time.monotonic()
    await asyncio.sleep((len(_words()) - 1) / WORDS_PER_S)              # the last word arrives
    body = {"model": model, "input": TEXT, "voice": VOICE, "response_format": "pcm", "stream": True,
            "temperature": 0, "max_tokens": MAX_TOKENS * clauses}
    first = None
    async with aiohttp.ClientSession() as http, http.post(url + "/v1/audio/speech", json=body) as resp:
        resp.raise_for_status()
        async for chunk in resp.content.iter_any():
            if chunk and first is None:
                first = time.monotonic() - start
    return {"first_audio": first, "done": time.monotonic() - start}
