"""The chat and prefill benches' load clients against a real tiny `mstar-run`: forced lengths, TTFT at the
first content token, closed and open loops and the command line, a long prompt beside decoding streams."""
from __future__ import annotations

import json
import time
import urllib.request
from typing import Iterator

import pytest

from bench import prefill_load
from bench.openai_load import ChatJob, chat_burst, chat_load, main, model_card
from tests.runtime.serving.conftest import Server, serve_tiny


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serve_tiny(tmp_path_factory, "smollm2")


def test_burst_streams_forced_lengths_and_times_the_first_content_token(server: Server) -> None:
    jobs = [ChatJob("Tell me a story.", 8), ChatJob("Tell me another story.", 24)]
    got = chat_burst(server.url, model_card(server.url)["id"], jobs)
    assert got.completion_tokens == [8, 24]
    assert got.ttft_s is not None and all(0 < t < e for t, e in zip(got.ttft_s, got.e2e_s))
    metrics = got.metrics()
    assert set(metrics) == {"tok_s", "p50_e2e", "p95_e2e", "p50_ttft"} and metrics["tok_s"] > 0


def test_closed_and_open_loops_send_every_job_and_the_command_line_reports_them(
        server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    model = model_card(server.url)["id"]
    jobs = [ChatJob("Tell me a story.", 8)] * 3
    one_at_a_time = chat_load(server.url, model, jobs, concurrency=1)
    assert one_at_a_time.completion_tokens == [8, 8, 8]
    assert one_at_a_time.wall_s >= sum(one_at_a_time.e2e_s)      # one client: the requests never overlapped
    assert chat_load(server.url, model, jobs, concurrency=1, rate=50.0).completion_tokens == [8, 8, 8]
    main(["--url", server.url, "--concurrency", "2", "--requests", "3",
          "--max-tokens", "16"])   # random weights: a token's text may be empty
    out = capsys.readouterr().out
    assert "requests 3 " in out and "output tokens 48 " in out and "TTFT p50" in out and "E2E  p50" in out


def test_prefill_load_times_a_prompt_beside_decoding_streams_then_cuts_them(server: Server) -> None:
    model = model_card(server.url)["id"]
    words = ["apple", "river", "stone", "house"] * 5
    loaded = prefill_load.loaded(server.url, model, prefill_load.prompt_words(words, 200, nonce=1),
                                 [prefill_load.prompt_words(words, 8, nonce=i) for i in (2, 3)], 1000,
                                 max_tokens=16)   # random weights: a token's text may be empty
    got = loaded.timed
    assert got.completion_tokens == 16 and got.prompt_tokens > 200 and got.ttft_s > 0
    assert len(loaded.gaps) == 2 and all(g > 0 for g in loaded.gaps)
    assert len(loaded.served) == 2           # one count a stream (Background.served, tested below)
    deadline = time.monotonic() + 10     # the cut streams are aborted: the server holds no request
    while _num_requests(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _num_requests(server) == 0


def _num_requests(server: Server) -> int:
    with urllib.request.urlopen(server.url + "/v1/state") as resp:
        return json.load(resp)["num_requests"]


def test_decode_gap_runs_from_the_last_chunk_before_to_the_first_after_and_served_counts_the_wait() -> None:
    stream = prefill_load.Background(arrivals=[1.0, 1.1, 2.5, 2.6, 4.0])
    # differences of decimal seconds round (2.5 - 1.1 is 1.4000000000000001): approx's default rel 1e-6
    assert stream.max_gap(start=2.0, end=3.0, now=9.0) == pytest.approx(1.4)     # 1.1 -> 2.5
    assert stream.max_gap(start=2.7, end=3.0, now=9.0) == pytest.approx(1.4)     # 2.6 -> 4.0, rounded as above
    assert stream.max_gap(start=4.5, end=5.0, now=9.0) == pytest.approx(5.0)     # 4.0 -> now (9.0), rounded
    assert stream.served(start=1.0, end=2.6) == 3                                # 1.1, 2.5, 2.6: (start, end]
    assert stream.served(start=4.0, end=9.0) == 0
    prompt = prefill_load.prompt_words(["a", "b"], 3, nonce=7)
    assert prompt.content == "Words: a b a" and len(prompt.system.split()) == prefill_load.NONCE_WORDS
    assert prompt.system.split()[:3] == ["b", "b", "b"]            # 7 = 0b111, least significant digit first


def test_a_first_token_without_text_is_timed_at_the_chunk_that_finishes_the_answer() -> None:
    """A server whose one token is a special one (its text skipped) sends the role, then a chunk that only
    finishes the answer: with max_tokens=1 that chunk cannot come before the token, so it is the TTFT."""
    import asyncio

    from aiohttp import web

    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
              {"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 1}}]

    async def chat(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in chunks:
            await asyncio.sleep(0.05)
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def go() -> tuple[prefill_load.Timed, float]:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        try:
            async with prefill_load.session() as http:
                start = time.perf_counter()
                got = await prefill_load.timed(http, url, "m", prefill_load.prompt_words(["a"], 4, 1))
                return got, time.perf_counter() - start
        finally:
            await runner.cleanup()

    got, total = asyncio.run(go())
    assert (got.prompt_tokens, got.completion_tokens) == (30, 1)
    assert 0.1 <= got.ttft_s <= total      # the finishing chunk (the second), not the role chunk (the first)
