"""Long prompts timed to their first content token, alone or while other streams decode
(the prefill suite's load).

A prompt is a system message, the nonce, and a user message of one-token words (checked with the
model's tokenizer), N tokens in all after the chat template. The nonce comes first because the template
puts everything else before the content: without a system message SmolLM2's template writes its default
one (about 26 tokens, the same in every request), so a nonce in the user message would leave the first
KV block of every prompt a cache hit. The system message is NONCE_WORDS one-token words spelling the
nonce in base len(words), least significant first: after `<|im_start|>system\n` (3 tokens) two prompts
part within their first 16 tokens. Every request is streamed, greedy, with a forced output length
(`max_tokens` + `ignore_eos`); TTFT runs from the send to the first chunk carrying content. Background
streams are the same kind of chat with a long forced output; the longest gap between two of their
content chunks while the long prompt waits for its first token shows whether decoding kept flowing.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import aiohttp

# common English words; the suite keeps those that are one token with a leading space
WORDS = ("apple river stone house green water light table music paper window garden school money story "
         "friend family morning winter summer mountain market forest animal bottle letter island travel "
         "doctor teacher kitchen orange yellow purple silver golden bright quiet simple strong little "
         "ancient modern famous happy early late open close north south east west road bridge tower").split()
NONCE_WORDS = 13    # the system message: 3 template tokens + 13 words = the first 16-token KV block


@dataclass(frozen=True)
class Prompt:
    """One request's messages: the nonce as the system message, then the words."""

    system: str              # NONCE_WORDS words spelling the nonce (prompt_words)
    content: str             # "Words:" and the body's words

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.content}]


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


def nonce_words(words: Sequence[str], nonce: int) -> list[str]:
    """`nonce` in base len(words), least significant digit first, as NONCE_WORDS words (distinct nonces below
    len(words) ** NONCE_WORDS differ within the first word where their digits do)."""
    digits = []
    for _ in range(NONCE_WORDS):
        nonce, digit = divmod(nonce, len(words))
        digits.append(words[digit])
    return digits


def prompt_words(words: Sequence[str], num_words: int, nonce: int) -> Prompt:
    """The nonce's system message and "Words:" with `num_words` one-token words, each after a space (so
    each stays one token)."""
    system = "".join(" " + w for w in nonce_words(words, nonce))
    return Prompt(system, "Words:" + "".join(" " + words[i % len(words)] for i in range(num_words)))


def _body(model: str, prompt: Prompt, max_tokens: int, extra: Mapping[str, Any]) -> dict:
    return {"model": model, "messages": prompt.messages(), "stream": True,
            "stream_options": {"include_usage": True}, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, **extra}


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


def _finished(chunk: dict) -> bool:
    return bool(chunk.get("choices")) and chunk["choices"][0].get("finish_reason") is not None


async def timed(session: aiohttp.ClientSession, url: str, model: str, prompt: Prompt, max_tokens: int = 1,
                extra: Mapping[str, Any] | None = None) -> Timed:
    """One streamed chat: TTFT at the first content chunk, and the server's token counts. A first token whose
    text is empty (a special token the answer skips) sends no content: its TTFT is then the chunk that finishes
    the answer, which with `max_tokens=1` cannot come before that token was computed."""
    start, ttft, finished, usage = time.perf_counter(), None, None, None
    async for at, chunk in _chunks(session, url, _body(model, prompt, max_tokens, extra or {})):
        if ttft is None and _content(chunk):
            ttft = at - start
        if finished is None and _finished(chunk):
            finished = at - start
        usage = chunk.get("usage") or usage
    if ttft is None and max_tokens == 1:
        ttft = finished
    if ttft is None or usage is None:
        raise RuntimeError(f"{url}: the stream ended without {'content' if ttft is None else 'usage'}")
    return Timed(ttft, int(usage["prompt_tokens"]), int(usage["completion_tokens"]))


async def background(session: aiohttp.ClientSession, url: str, model: str, prompt: Prompt, max_tokens: int,
                      into: Background, extra: Mapping[str, Any] | None = None) -> None:
    async for at, chunk in _chunks(session, url, _body(model, prompt, max_tokens, extra or {})):
        if _content(chunk):
            into.arrivals.append(at)


async def under_load(url: str, model: str, prompt: Prompt, streams: Sequence[Prompt], stream_tokens: int,
                     max_tokens: int = 1, extra: Mapping[str, Any] | None = None) -> Loaded:
    """Start `streams` decoding, wait until each has sent content, then time `prompt`; the
    streams' longest gap between chunks and their chunks received while it waited. The streams
    are cut afterwards."""
    async with session() as http:
        runs = [Background() for _ in streams]
        tasks = [asyncio.create_task(background(http, url, model, s, stream_tokens, r, extra))
                 for s, r in zip(streams, runs)]
        try:
            while not all(len(r.arrivals) >= 2 for r in runs):   # every stream is past its prefill
                if any(t.done() for t in tasks):
                    await asyncio.gather(*tasks)      # raises what went wrong
                    raise RuntimeError(f"{url}: a background stream ended before the long prompt was sent")
                await asyncio.sleep(0.05)
            start = time.perf_counter()
            got = await timed(http, url, model, prompt, max_tokens, extra)
            end = start + got.ttft_s
            await asyncio.sleep(0.5)      # the chunk that ends a stream's last gap has time to arrive
            now = time.perf_counter()
            return Loaded(got, [r.max_gap(start, end, now) for r in runs], [r.served(start, end) for r in runs])
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def alone(url: str, model: str, prompt: Prompt, max_tokens: int = 1, extra: Mapping[str, Any] | None = None) -> Timed:
    async def go() -> Timed:
        async with session() as http:
            return await timed(http, url, model, prompt, max_tokens, extra)
    return asyncio.run(go())


def loaded(url: str, model: str, prompt: Prompt, streams: Sequence[Prompt], stream_tokens: int,
           max_tokens: int = 1, extra: Mapping[str, Any] | None = None) -> Loaded:
    return asyncio.run(under_load(url, model, prompt, streams, stream_tokens, max_tokens, extra))


def session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800),
                                 connector=aiohttp.TCPConnector(limit=0))
