"""Streamed OpenAI chats timed to their first token: bursts sharing a system prompt, and a
conversation growing turn by turn (the prefix suite's load).

Each request streams (`"stream": true`, usage in the last chunk), greedy, with a forced
output length (`max_tokens` + `ignore_eos`). TTFT runs from the send to the first chunk
carrying content; a burst's wall time from the first send to the last byte.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import aiohttp

from bench.stats import percentile


@dataclass(frozen=True)
class Streamed:
    ttft_s: float
    text: str
    completion_tokens: int


async def _stream(session: aiohttp.ClientSession, url: str, model: str, messages: list[dict],
                  max_tokens: int) -> Streamed:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    start, ttft, parts, tokens = time.perf_counter(), None, [], 0
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {await resp.text()}")
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                content = choice.get("delta", {}).get("content")
                if content:
                    ttft = ttft if ttft is not None else time.perf_counter() - start
                    parts.append(content)
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
    if ttft is None:
        raise RuntimeError(f"{url}: a streamed chat sent no content")
    return Streamed(ttft, "".join(parts), tokens)


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800),
                                 connector=aiohttp.TCPConnector(limit=0))


def shared_prompt_burst(url: str, model: str, system: str, questions: list[str], max_tokens: int) -> dict[str, float]:
    """One chat with `system` first, alone (cold: it fills a prefix cache), a second alone (warm),
    then every question at once with the same system prompt: the cold and warm TTFTs, their
    ratio, and TTFT p50 / p95 and total tok/s of the burst."""
    async def go() -> dict[str, float]:
        async with _session() as session:
            alone = [await _stream(session, url, model, [{"role": "system", "content": system},
                                                         {"role": "user", "content": hello}], 1)
                     for hello in ("Hello.", "Hello again.")]
            start = time.perf_counter()
            done = await asyncio.gather(*(_stream(session, url, model, [{"role": "system", "content": system},
                                                                         {"role": "user", "content": q}], max_tokens)
                                          for q in questions))
            wall = time.perf_counter() - start
        ttfts = [d.ttft_s for d in done]
        cold, warm = alone[0].ttft_s, alone[1].ttft_s
        return {"cold_ttft": cold, "warm_ttft": warm, "cold_over_warm": cold / warm,
                "ttft_p50": percentile(ttfts, 50), "ttft_p95": percentile(ttfts, 95),
                "tok_s": sum(d.completion_tokens for d in done) / wall}
    return asyncio.run(go())


def conversation(url: str, model: str, system: str, turns: list[str | list[dict]],
                 max_tokens: int) -> dict[str, float]:
    """One conversation, turn after turn, each resending the whole history: TTFT of every turn (a turn
    is a user message's content: text, or content parts such as a picture and text)."""
    async def go() -> dict[str, float]:
        messages, out = [{"role": "system", "content": system}], {}
        async with _session() as session:
            for i, turn in enumerate(turns, start=1):
                messages.append({"role": "user", "content": turn})
                got = await _stream(session, url, model, messages, max_tokens)
                messages.append({"role": "assistant", "content": got.text})
                out[f"ttft_turn{i}"] = got.ttft_s
        return out
    return asyncio.run(go())
