"""Load generator for `mstar-run` chat serving, and the stack-efficiency check.

    python tools/bench_serving.py --url http://127.0.0.1:8000 --concurrency 16 --requests 64 --max-tokens 64
    python tools/bench_serving.py --url ... --rate 4 --requests 64           # Poisson arrivals, 4 req/s
    python tools/bench_serving.py --url ... --concurrency 16 --bare plan.bin  # + bare component loop at batch 16

Closed loop (`--concurrency N`): N clients each send their next request when the last one
ends. Open loop (`--rate R`): requests arrive as a Poisson process of R per second.
Prints TTFT (at the first chunk carrying content) and end-to-end p50/p95 and output tokens/s. Requests use `ignore_eos`, so
every request generates exactly `--max-tokens` tokens. `--bare PLAN` also runs the plan's
LM node in this process through the same executor the worker uses (no HTTP, no conductor,
no ZeroMQ) at batch N for the same tokens, and prints served/bare throughput.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time

import aiohttp
from runtime.sampling import SamplingParams
from runtime.transport.request_params import RequestParams


async def one_request(session: aiohttp.ClientSession, url: str, model: str, i: int, max_tokens: int) -> dict:
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
            "messages": [{"role": "user", "content": f"Write a story about request {i}."}],
            "stream_options": {"include_usage": True}}
    start, ttft, tokens = time.perf_counter(), None, 0
    async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif ttft is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - start
    return {"ttft": ttft or 0.0, "e2e": time.perf_counter() - start, "tokens": tokens}


async def run_load(args: argparse.Namespace) -> tuple[list[dict], float]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        model = (await (await session.get(f"{args.url}/v1/models")).json())["data"][0]["id"]
        start = time.perf_counter()
        if args.rate:
            rng = random.Random(0)
            tasks = []
            for i in range(args.requests):
                tasks.append(asyncio.create_task(one_request(session, args.url, model, i, args.max_tokens)))
                await asyncio.sleep(rng.expovariate(args.rate))
            results = await asyncio.gather(*tasks)
        else:
            queue = list(range(args.requests))

            async def client() -> list[dict]:
                out = []
                while queue:
                    out.append(await one_request(session, args.url, model, queue.pop(), args.max_tokens))
                return out
            results = [r for rs in await asyncio.gather(*(client() for _ in range(args.concurrency))) for r in rs]
        return results, time.perf_counter() - start


def bare_tokens_per_s(plan_path: str, batch: int, max_tokens: int, prompt_len: int = 32) -> float:
    """The LM node's own decode loop at batch `batch`: prefill, then max_tokens - 1 steps."""
    import torch

    from mstar_compiler.plan import load_plan
    from runtime.executors import executor_for
    from runtime.transport.messages import WorkItem
    from runtime.worker.loader import load_rank
    plan = load_plan(plan_path)
    name = next(n.name for n in plan.nodes if n.has_kv_cache)
    module, _ = load_rank(plan, 0, None)[name]
    ex = executor_for(plan.node(name), module, 0, plan)
    torch.manual_seed(0)
    for rid in range(batch):
        ex.open(rid, RequestParams(sampling=SamplingParams(temperature=0.0)))
    items = [WorkItem(request_id=rid, tokens=torch.randint(0, 1000, (prompt_len,)).tolist()) for rid in range(batch)]
    start = time.perf_counter()
    results = ex.run(items, [{}] * batch)
    for _ in range(max_tokens - 1):
        results = ex.run([WorkItem(request_id=rid, tokens=r.tokens) for rid, r in enumerate(results)], [{}] * batch)
    return batch * max_tokens / (time.perf_counter() - start)


def report(results: list[dict], wall: float) -> float:
    def pct(xs: list[float], p: float) -> float:
        return statistics.quantiles(xs, n=100)[p - 1] if len(xs) > 1 else xs[0]
    ttft, e2e = [r["ttft"] for r in results], [r["e2e"] for r in results]
    tokens = sum(r["tokens"] for r in results)
    print(f"requests {len(results)}  wall {wall:.1f} s  output tokens {tokens}  throughput {tokens / wall:.1f} tok/s")
    print(f"TTFT p50 {pct(ttft, 50) * 1e3:.0f} ms  p95 {pct(ttft, 95) * 1e3:.0f} ms")
    print(f"E2E  p50 {pct(e2e, 50):.2f} s  p95 {pct(e2e, 95):.2f} s")
    return tokens / wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--rate", type=float, default=0.0, help="Poisson arrivals per second (0: closed loop)")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--bare", default=None, help="plan.bin: also time the bare component loop at batch --concurrency")
    args = p.parse_args()
    served = report(*asyncio.run(run_load(args)))
    if args.bare:
        bare = bare_tokens_per_s(args.bare, args.concurrency, args.max_tokens)
        print(f"bare component loop at batch {args.concurrency}: {bare:.1f} tok/s; "
              f"stack efficiency served/bare = {served / bare:.2f}")


if __name__ == "__main__":
    main()
