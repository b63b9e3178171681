"""Concurrent OpenAI chat requests against one server, timed end to end: the chat load generator.

    python tools/bench/openai_load.py --url http://127.0.0.1:8000 --concurrency 16 --requests 64 --max-tokens 64
    python tools/bench/openai_load.py --url ... --rate 4 --requests 64     # Poisson arrivals, 4 requests/s

A burst (`chat_burst`, what the suites send) sends every request at once. Closed loop
(`--concurrency N`): N clients each send their next request when the last one ends. Open loop
(`--rate R`): requests arrive as a Poisson process of R per second. Requests are streamed (SSE,
aiohttp, one connection each), greedy, each with its own forced output length (`max_tokens` plus
vLLM's `ignore_eos` extension; the chat suite checks that every side returns exactly those
lengths). Useful tokens are the completion tokens the server reports in `usage`
(`stream_options.include_usage`); the wall time runs from the first send to the last response.
TTFT is timed at the first chunk that carries content, not at the first chunk: a server may send
the role before it has computed anything. What the stack itself costs, served against the bare
component loop at the same batch: `python tools/bench.py stack`.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Mapping, Sequence

import aiohttp

if __name__ == "__main__":   # run as a script: `bench` is the package this file lives in
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from bench.stats import percentile  # noqa: E402


@dataclass(frozen=True)
class ChatJob:
    prompt: str
    max_tokens: int            # forced output length (with ignore_eos)
    system: str | None = None  # a system message sent first (the suites' nonce: bench.chat_prompts)
    image: str | None = None   # a data URL sent as an image part before the prompt

    def messages(self) -> list[dict[str, Any]]:
        """The request's `messages`: the system message (when given), then the prompt (after the image) as the user's."""
        head = [] if self.system is None else [{"role": "system", "content": self.system}]
        if self.image is None:
            return [*head, {"role": "user", "content": self.prompt}]
        parts = [{"type": "image_url", "image_url": {"url": self.image}}, {"type": "text", "text": self.prompt}]
        return [*head, {"role": "user", "content": parts}]


@dataclass(frozen=True)
class Answer:
    """One streamed request as the client saw it."""

    e2e_s: float                 # send -> full response
    completion_tokens: int       # from `usage`
    ttft_s: float                # send -> first content chunk


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


async def sse_json(resp: aiohttp.ClientResponse) -> AsyncIterator[dict]:
    """Each `data: {...}` event of a streamed (SSE) response, parsed; `[DONE]` and other lines skipped."""
    async for line in resp.content:
        if line.startswith(b"data: {"):
            yield json.loads(line[6:])


async def _one(session: aiohttp.ClientSession, url: str, model: str, job: ChatJob,
               extra: Mapping[str, Any]) -> Answer:
    """One streamed request, timed; `extra` fields join its body (a peer's own, e.g. llama.cpp's cache_prompt)."""
    body = {"model": model, "messages": job.messages(), "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": job.max_tokens, "temperature": 0.0, "ignore_eos": True, **extra}
    start, ttft, usage = time.perf_counter(), None, None
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {await resp.text()}")
        async for chunk in sse_json(resp):
            usage = chunk.get("usage") or usage
            if ttft is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - start
    if usage is None or ttft is None:
        raise RuntimeError(f"{url}: the stream ended without {'usage' if usage is None else 'any content'}")
    return Answer(time.perf_counter() - start, int(usage["completion_tokens"]), ttft)


async def _run(url: str, model: str, jobs: Sequence[ChatJob], concurrency: int,
               arrivals: Sequence[float], extra: Mapping[str, Any]) -> BurstResult:
    """Every job, at most `concurrency` in flight, job i sent no earlier than `arrivals[i]` s after the start."""
    gate = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        async def send(job: ChatJob, at: float) -> Answer:
            if at > 0:
                await asyncio.sleep(at)
            async with gate:
                return await _one(session, url, model, job, extra)

        start = time.perf_counter()
        done = await asyncio.gather(*(send(j, at) for j, at in zip(jobs, arrivals)))
        wall = time.perf_counter() - start
    return BurstResult([d.e2e_s for d in done], [d.completion_tokens for d in done], wall, [d.ttft_s for d in done])


def chat_burst(url: str, model: str, jobs: Sequence[ChatJob], extra: Mapping[str, Any] | None = None) -> BurstResult:
    """Send every job at once to `url` and wait for all of them (`extra`: fields every body carries)."""
    return asyncio.run(_run(url, model, jobs, len(jobs), [0.0] * len(jobs), extra or {}))


def chat_load(url: str, model: str, jobs: Sequence[ChatJob], concurrency: int, rate: float = 0.0) -> BurstResult:
    """Closed loop: `concurrency` clients, each sending its next job when its last one ends. With `rate` > 0,
    open loop instead: jobs arrive as a Poisson process of `rate` per second (seeded: the same times every run)."""
    if rate <= 0:
        return asyncio.run(_run(url, model, jobs, concurrency, [0.0] * len(jobs), {}))
    rng = random.Random(0)
    arrivals = [0.0, *itertools.accumulate(rng.expovariate(rate) for _ in jobs[1:])]
    return asyncio.run(_run(url, model, jobs, len(jobs), arrivals, {}))


def model_card(url: str) -> dict:
    """The first model card `GET /v1/models` lists (its `id` is the name to request)."""
    async def get() -> dict:
        async with aiohttp.ClientSession() as session, session.get(url + "/v1/models") as resp:
            return (await resp.json())["data"][0]
    return asyncio.run(get())


def report(got: BurstResult) -> str:
    """Requests, wall time, output tokens and tokens/s; TTFT (when streamed) and end-to-end p50 / p95."""
    tokens = sum(got.completion_tokens)
    lines = [f"requests {len(got.e2e_s)}  wall {got.wall_s:.1f} s  output tokens {tokens}  "
             f"throughput {tokens / got.wall_s:.1f} tok/s"]
    if got.ttft_s is not None:
        lines.append(f"TTFT p50 {percentile(got.ttft_s, 50) * 1e3:.0f} ms  p95 {percentile(got.ttft_s, 95) * 1e3:.0f} ms")
    lines.append(f"E2E  p50 {percentile(got.e2e_s, 50):.2f} s  p95 {percentile(got.e2e_s, 95):.2f} s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--concurrency", type=int, default=16, help="clients of the closed loop")
    p.add_argument("--rate", type=float, default=0.0, help="Poisson arrivals per second (0: closed loop)")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64, help="forced output length of every request")
    args = p.parse_args(argv)
    if args.concurrency < 1 and args.rate <= 0:
        p.error(f"--concurrency must be at least 1 for a closed loop, got {args.concurrency}")
    jobs = [ChatJob(f"Write a story about request {i}.", args.max_tokens) for i in range(args.requests)]
    print(report(chat_load(args.url, model_card(args.url)["id"], jobs, args.concurrency, args.rate)))


if __name__ == "__main__":
    main()
