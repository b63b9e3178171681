"""Overload against a real `mstar-run --max-concurrency 32 --max-queue 64`: 256 concurrent streamed
chats each either complete with their full output or are refused at once with 429 and
Retry-After; none hangs, and every KV block is free afterwards."""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from tests.runtime.serving.conftest import Server, compile_plan, http

MODEL = "smollm2-135m-instruct"
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def server(plan_dir):
    srv = Server(compile_plan(plan_dir, "smollm2", preset="tiny"), "--max-concurrency", "32", "--max-queue", "64",
                 env={"OMP_NUM_THREADS": "1"})
    try:
        srv.wait_ready(60)
        yield srv
    finally:
        srv.stop()


def streamed_chat(url: str, i: int, outcome: dict) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"request {i}"}], "max_tokens": MAX_TOKENS,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(f"{url}/v1/chat/completions", json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            events = [line[6:] for line in resp.read().decode().splitlines() if line.startswith("data: ")]
        chunks = [json.loads(e) for e in events if e != "[DONE]"]
        usage = chunks[-1].get("usage") or {}
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
        outcome[i] = ("done", usage.get("completion_tokens"), finish, events[-1])
    except urllib.error.HTTPError as err:
        outcome[i] = (err.code, err.headers.get("Retry-After"), json.loads(err.read())["error"]["code"])


def test_overload_is_refused_cleanly_and_nothing_hangs(server) -> None:
    outcome: dict = {}
    threads = [threading.Thread(target=streamed_chat, args=(server.url, i, outcome)) for i in range(256)]
    [t.start() for t in threads]
    [t.join(300) for t in threads]
    assert not any(t.is_alive() for t in threads)              # none hangs
    done = [v for v in outcome.values() if v[0] == "done"]
    refused = [v for v in outcome.values() if v[0] != "done"]
    assert len(done) + len(refused) == 256
    assert all(v == ("done", MAX_TOKENS, "length", "[DONE]") for v in done)
    assert all(v == (429, "1", "queue_full") for v in refused)
    assert len(done) >= 64 and refused         # at least a full queue is served, whatever the arrival order
    assert server.metric("mstar_kv_cache_usage") == 0.0
    assert http("POST", f"{server.url}/v1/chat/completions", {"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "user", "content": "after"}]})[0] == 200
