"""Image-generation requests against one server, at a fixed concurrency, timed end to end.

Each job is one OpenAI `POST /v1/images/generations` (n = 1, b64 PNG back) with its own
prompt and seed; at most `concurrency` are in flight (closed loop: the next is sent when
one returns). A request's E2E time runs from its send to its full response.
"""
from __future__ import annotations

import asyncio
import base64
import io
import time
from dataclasses import dataclass
from typing import Any, Sequence

import aiohttp

from bench.stats import percentile


@dataclass(frozen=True)
class ImageJob:
    prompt: str
    seed: int


@dataclass(frozen=True)
class ImageRun:
    e2e_s: list[float]     # per request, in job order
    pngs: list[bytes]      # per request, in job order
    wall_s: float          # first send -> last response

    def metrics(self) -> dict[str, float]:
        """p50 E2E seconds per image, and images per second over the run."""
        return {"p50_e2e": percentile(self.e2e_s, 50), "img_s": len(self.e2e_s) / self.wall_s}


async def _one(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
               gate: asyncio.Semaphore) -> tuple[float, bytes]:
    async with gate:
        start = time.perf_counter()
        async with session.post(url + "/v1/images/generations", json=body) as resp:
            data = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"{url}: HTTP {resp.status}: {data}")
        return time.perf_counter() - start, base64.b64decode(data["data"][0]["b64_json"])


async def _run(url: str, model: str, jobs: Sequence[ImageJob], extra: dict[str, Any], concurrency: int) -> ImageRun:
    gate = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()
        done = await asyncio.gather(*(_one(session, url, {"model": model, "prompt": j.prompt, "seed": j.seed,
                                                          "response_format": "b64_json", **extra}, gate)
                                      for j in jobs))
        wall = time.perf_counter() - start
    return ImageRun([d[0] for d in done], [d[1] for d in done], wall)


def generate_images(url: str, model: str, jobs: Sequence[ImageJob], extra: dict[str, Any],
                    concurrency: int) -> ImageRun:
    """Send `jobs` to `url` with at most `concurrency` in flight; `extra` joins every body (size, steps)."""
    return asyncio.run(_run(url, model, jobs, extra, concurrency))


def pixels(png: bytes):
    """A PNG -> (H, W, 3) int64 numpy array."""
    import numpy as np
    from PIL import Image
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(np.int64)
