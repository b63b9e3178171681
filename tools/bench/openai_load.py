"""A burst of concurrent OpenAI chat requests against one server, timed end to end.

All requests are sent at once (aiohttp, one connection each), streamed (SSE), greedy,
each with its own forced output length (`max_tokens` plus vLLM's `ignore_eos`
extension; the chat suite checks that every side returns exactly those lengths). Useful tokens are the completion tokens
the server reports in `usage` (`stream_options.include_usage`); the burst's wall time runs from the first send to the
last response. TTFT is timed at the first chunk that carries content, not at the first
chunk: a server may send the role before it has computed anything.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Sequence

import aiohttp

from bench.stats import percentile


@dataclass(frozen=True)
class ChatJob:
    prompt: str
    max_tokens: int   # forced output length (with ignore_eos)


@dataclass(frozen=True)
class BurstResult:
    e2e_s: list[float]            # per request, send -> full response
    completion_tokens: list[int]  # per request, from `usage`
    wall_s: float                 # first send -> last response
    ttft_s: list[float] | None = None   # per request, send -> first content chunk (None: not streamed)

    def metrics(self) -> dict[str, float]:
        """useful tok/s, p50/p95 end-to-end latency (s), p50 TTFT (s) when streamed."""
        out = {"tok_s": sum(self.completion_tokens) / self.wall_s,
               "p50_e2e": percentile(self.e2e_s, 50), "p95_e2e": percentile(self.e2e_s, 95)}
        if self.ttft_s is not None:
            out["p50_ttft"] = percentile(self.ttft_s, 50)
        return out


async def _one(session: aiohttp.ClientSession, url: str, model: str, job: ChatJob) -> tuple[float, int, float]:
    """(E2E s, completion tokens, TTFT s at the first content chunk) of one streamed request."""
    body = {"model": model, "messages": [{"role": "user", "content": job.prompt}], "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": job.max_tokens, "temperature": 0.0, "ignore_eos": True}
    start, ttft, tokens = time.perf_counter(), None, None
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {await resp.text()}")
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
            if ttft is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - start
    if tokens is None or ttft is None:
        raise RuntimeError(f"{url}: the stream ended without {'usage' if tokens is None else 'any content'}")
    return time.perf_counter() - start, tokens, ttft


async def _burst(url: str, model: str, jobs: Sequence[ChatJob]) -> BurstResult:
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()
        done = await asyncio.gather(*(_one(session, url, model, j) for j in jobs))
        wall = time.perf_counter() - start
    return BurstResult([d[0] for d in done], [d[1] for d in done], wall, [d[2] for d in done])


def chat_burst(url: str, model: str, jobs: Sequence[ChatJob]) -> BurstResult:
    """Send every job at once to `url` and wait for all of them."""
    return asyncio.run(_burst(url, model, jobs))


def model_card(url: str) -> dict:
    """The first model card `GET /v1/models` lists (its `id` is the name to request)."""
    async def get() -> dict:
        async with aiohttp.ClientSession() as session, session.get(url + "/v1/models") as resp:
            return (await resp.json())["data"][0]
    return asyncio.run(get())
