"""A 100-megapixel PNG posted while chats stream (tiny BAGEL served by a real `mstar-run`, the
official `openai` client) does not stall the streams: decoding and resizing it runs off the event
loop that drives the conductor, so the streams' tokens keep coming while it decodes (~5 s here).

Measured as gaps between tokens, never by wall-clock seconds. The streams may wait for one batch,
and the image request's own batches (its ViT, its prompt's prefill, which the decodes ride along
with) are the longest: that allowance is measured by posting the same image at the size the server
resizes it to, whose model work is the same but which costs nothing to decode. Tiny BAGEL's random weights mostly emit byte tokens that are not whole UTF-8
characters, and the server holds those back until a character is complete, so one stream's chunk
gaps span many tokens. A stall holds every stream at once, so the gaps measured are those between
chunks of any of four streams; the period is the server's own count (`/v1/state`: age over output
tokens) just before the image is sent.
"""
from __future__ import annotations

import asyncio
import base64
import statistics
import struct
import time
import zlib
from typing import Iterator

import numpy as np
import openai
import pytest

from mstar_compiler.plan import load_plan
from runtime.models.bagel.generation import vae_resize
from runtime.models.bagel.image_io import target_size
from runtime.models.bagel.serving import bagel_lm_dims
from runtime.entrypoints.http.multimodal import MAX_IMAGE_PIXELS
from tests.runtime.serving.bagel.conftest import MODEL, png
from tests.runtime.serving.conftest import Server, compile_plan, http, serve

SIDE = 10_000                # 100 MP: under the 2^27-pixel limit, so it is decoded, not refused
PROMPTS = ["Tell me a story.", "Name a colour.", "Count to ten.", "What is a ship?"]
# The huge image's longest gap may be that of the same image small (its batches), up to 3 times
# over (while the decode thread takes a core from the worker on a 2-core machine, batches run
# slower), plus 50 token periods of scheduling noise. Decoding it on the event loop would hold
# every stream for the whole decode instead: ~5 s, ~20 times the small image's gap, ~250 periods.
SLOWER_BATCHES = 3
SLACK_PERIODS = 50


@pytest.fixture(scope="module")
def plan(plan_dir) -> str:
    return compile_plan(plan_dir, "bagel", preset="tiny")


@pytest.fixture(scope="module")
def server(plan: str) -> Iterator[Server]:
    yield from serve(plan)


@pytest.fixture(scope="module")
def resized_png(plan: str) -> bytes:
    """The huge image's size after the server's resize (its model work), as a small PNG."""
    return png(*target_size(SIDE, SIDE, vae_resize(bagel_lm_dims(load_plan(plan)))))


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


@pytest.fixture(scope="module")
def huge_png() -> bytes:
    """A 10,000 x 10,000 RGB PNG (~300 MB decoded): a colour ramp in its first row, every other row
    filtered "Up" (equal to the row above). Its zlib stream is built from one compressed block of
    rows, flushed in full (the compressor forgets its history) and repeated, so making it costs
    a fraction of a second instead of compressing 300 MB."""
    ramp = np.linspace(0, 255, SIDE).astype(np.uint8)
    first = b"\x00" + np.stack([ramp, ramp[::-1], np.full(SIDE, 128, np.uint8)], -1).tobytes()
    rows = (b"\x02" + bytes(3 * SIDE)) * 100                 # 100 "Up" rows of zero differences
    comp = zlib.compressobj(6)
    head = comp.compress(first) + comp.flush(zlib.Z_FULL_FLUSH)
    block = comp.compress(rows) + comp.flush(zlib.Z_FULL_FLUSH)
    num_blocks, rest = divmod(SIDE - 1, 100)
    tail = comp.compress(rows[: rest * len(rows) // 100]) + comp.flush()
    adler = zlib.adler32(first)
    for _ in range(num_blocks):
        adler = zlib.adler32(rows, adler)
    adler = zlib.adler32(rows[: rest * len(rows) // 100], adler)
    idat = head + block * num_blocks + tail[:-4] + struct.pack(">I", adler)   # the checksum of the whole
    header = struct.pack(">IIBBBBB", SIDE, SIDE, 8, 2, 0, 0, 0)             # 8-bit RGB
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


async def _gaps_around_an_image(server: Server, image: bytes) -> tuple[float, list[float]]:
    """The streams' token period before the image request is sent, and the gaps between their
    chunks (of any stream) while it is in the server."""
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)
    arrivals: list[list[float]] = [[] for _ in PROMPTS]
    marks: dict[str, float] = {}

    async def stream(i: int) -> None:
        chunks = await client.chat.completions.create(
            model=MODEL, temperature=0, max_tokens=4000, stream=True, extra_body={"ignore_eos": True},
            messages=[{"role": "user", "content": PROMPTS[i]}])
        async with chunks:
            async for chunk in chunks:
                if chunk.choices and chunk.choices[0].delta.content:
                    arrivals[i].append(time.perf_counter())
                if "done" in marks and arrivals[i] and arrivals[i][-1] > marks["done"]:
                    break

    async def image_chat() -> float:
        while min(len(a) for a in arrivals) < 10:     # every stream is flowing
            await asyncio.sleep(0.005)
        _, state = await asyncio.to_thread(http, "GET", f"{server.url}/v1/state")
        periods = [r["age_s"] / r["num_output_tokens"] for r in state["requests"] if r["num_output_tokens"]]
        url = "data:image/png;base64," + base64.b64encode(image).decode()
        marks["sent"] = time.perf_counter()
        await client.chat.completions.create(model=MODEL, max_tokens=2, temperature=0, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "what is this?"}]}])
        marks["done"] = time.perf_counter()
        assert len(periods) == len(PROMPTS), state
        return statistics.median(periods)

    *_, period = await asyncio.gather(*(stream(i) for i in range(len(PROMPTS))), image_chat())
    during = sorted(t for times in arrivals for t in times if marks["sent"] < t <= marks["done"])
    points = [marks["sent"], *during, marks["done"]]
    return period, [b - a for a, b in zip(points, points[1:])]


def test_a_huge_image_does_not_stall_streaming_chats(server: Server, huge_png: bytes, resized_png: bytes) -> None:
    assert SIDE * SIDE <= MAX_IMAGE_PIXELS
    _, small_gaps = asyncio.run(_gaps_around_an_image(server, resized_png))
    period, gaps = asyncio.run(_gaps_around_an_image(server, huge_png))
    assert len(gaps) > 10, f"{len(gaps) - 1} chunks reached the streams while the image was in the server"
    bound = SLOWER_BATCHES * max(small_gaps) + SLACK_PERIODS * period
    assert max(gaps) <= bound, (
        f"the streams stalled {max(gaps) * 1e3:.0f} ms while the image was in the server for "
        f"{sum(gaps) * 1e3:.0f} ms (the same image small: {max(small_gaps) * 1e3:.0f} ms; "
        f"token period {period * 1e3:.1f} ms; bound {bound * 1e3:.0f} ms)")
