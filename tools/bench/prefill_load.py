"""Long prompts timed to their first content token, alone or while other streams decode
(the prefill suite's load).

A prompt of N tokens is N - overhead words that are each one token of the model's
vocabulary (checked with its tokenizer), the chat template adding `overhead`; its first
words are a permutation chosen by a nonce, so no two requests share a first KV block and
no prefix cache (mstar's or vLLM's) reuses an earlier prompt. Every request is streamed,
greedy, with a forced output length (`max_tokens` + `ignore_eos`); TTFT runs from the send
to the first chunk carrying content. Background streams are the same kind of chat with a
long forced output; the longest gap between two of their content chunks while the long
prompt waits for its first token shows whether decoding kept flowing.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Sequence

import aiohttp

# common English words; the suite keeps those that are one token with a leading space
WORDS = ("apple river stone house green water light table music paper window garden school money story "
         "friend family morning winter summer mountain market forest animal bottle letter island travel "
         "doctor teacher kitchen orange yellow purple silver golden bright quiet simple strong little "
         "ancient modern famous happy early late open close north south east west road bridge tower").split()
NONCE_WORDS = 16    # leading words permuted per request: 16 one-token words fill one 16-token KV block


@dataclass(frozen=True)
class Timed:
    ttft_s: float            # send -> first content chunk
    prompt_tokens: int       # as the server counted them (usage)
    completion_tokens: int


@dataclass
class Background:
    """One decoding stream: when each of its content chunks arrived."""

    arrivals: list[float] = field(default_factory=list)

    def max_gap(self, start: float, end: float, now: float) -> float:
        """Longest wait between two chunks around [start, end]: from the last chunk before `start`
        to the first after `end` (`now` if none came yet)."""
        before = max((t for t in self.arrivals if t <= start), default=start)
        after = next((t for t in self.arrivals if t > end), now)
        times = [before, *(t for t in self.arrivals if start < t <= end), after]
        return max(b - a for a, b in zip(times, times[1:]))

    def served(self, start: float, end: float) -> int:
        """Content chunks that arrived in (start, end]: what the stream got while the long prompt waited."""
        return sum(start < t <= end for t in self.arrivals)


@dataclass(frozen=True)
class Loaded:
    """The long prompt's timing and what its background streams saw while it waited."""

    timed: Timed
    gaps: list[float]        # each stream's longest wait between chunks around the wait (Background.max_gap)
    served: list[int]        # each stream's content chunks during the wait (Background.served)


def prompt_words(words: Sequence[str], num_words: int, nonce: int) -> str:
    """"Words:" and `num_words` one-token words, each after a space (so each stays one token);
    the first NONCE_WORDS of them are a permutation seeded by `nonce`."""
    head = random.Random(nonce).sample(list(words), min(NONCE_WORDS, len(words), num_words))
    body = [words[i % len(words)] for i in range(num_words - len(head))]
    return "Words:" + "".join(" " + w for w in head + body)


def _body(model: str, content: str, max_tokens: int) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], "stream": True,
            "stream_options": {"include_usage": True}, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True}


async def _chunks(session: aiohttp.ClientSession, url: str, body: dict):
    """Yield (arrival time, parsed chunk) of a streamed chat."""
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {await resp.text()}")
        async for raw in resp.content:
            if raw.startswith(b"data: {"):
                yield time.perf_counter(), json.loads(raw[6:])


def _content(chunk: dict) -> bool:
    return bool(chunk.get("choices")) and bool(chunk["choices"][0].get("delta", {}).get("content"))


async def timed(session: aiohttp.ClientSession, url: str, model: str, content: str, max_tokens: int = 1) -> Timed:
    """One streamed chat: TTFT at the first content chunk, and the server's token counts."""
    start, ttft, usage = time.perf_counter(), None, None
    async for at, chunk in _chunks(session, url, _body(model, content, max_tokens)):
        if ttft is None and _content(chunk):
            ttft = at - start
        usage = chunk.get("usage") or usage
    if ttft is None or usage is None:
        raise RuntimeError(f"{url}: the stream ended without {'content' if ttft is None else 'usage'}")
    return Timed(ttft, int(usage["prompt_tokens"]), int(usage["completion_tokens"]))


async def background(session: aiohttp.ClientSession, url: str, model: str, content: str, max_tokens: int,
                      into: Background) -> None:
    async for at, chunk in _chunks(session, url, _body(model, content, max_tokens)):
        if _content(chunk):
            into.arrivals.append(at)


async def under_load(url: str, model: str, content: str, streams: Sequence[str], stream_tokens: int,
                     max_tokens: int = 1) -> Loaded:
    """Start `streams` decoding, wait until each has sent content, then time `content`; the
    streams' longest gap between chunks and their chunks received while it waited. The streams
    are cut afterwards."""
    async with session() as http:
        runs = [Background() for _ in streams]
        tasks = [asyncio.create_task(background(http, url, model, s, stream_tokens, r))
                 for s, r in zip(streams, runs)]
        try:
            while not all(len(r.arrivals) >= 2 for r in runs):   # every stream is past its prefill
                if any(t.done() for t in tasks):
                    await asyncio.gather(*tasks)      # raises what went wrong
                    raise RuntimeError(f"{url}: a background stream ended before the long prompt was sent")
                await asyncio.sleep(0.05)
            start = time.perf_counter()
            got = await timed(http, url, model, content, max_tokens)
            end = start + got.ttft_s
            await asyncio.sleep(0.5)      # the chunk that ends a stream's last gap has time to arrive
            now = time.perf_counter()
            return Loaded(got, [r.max_gap(start, end, now) for r in runs], [r.served(start, end) for r in runs])
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def alone(url: str, model: str, content: str, max_tokens: int = 1) -> Timed:
    async def go() -> Timed:
        async with session() as http:
            return await timed(http, url, model, content, max_tokens)
    return asyncio.run(go())


def loaded(url: str, model: str, content: str, streams: Sequence[str], stream_tokens: int,
           max_tokens: int = 1) -> Loaded:
    return asyncio.run(under_load(url, model, content, streams, stream_tokens, max_tokens))


def session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800),
                                 connector=aiohttp.TCPConnector(limit=0))
