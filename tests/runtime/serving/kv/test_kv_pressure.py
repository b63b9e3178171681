"""A real `mstar-run` whose KV pool (8 blocks x 16 tokens) cannot hold all concurrent requests:
the conductor holds and preempts them (recomputing their context later) instead of failing,
and every request still gets the exact text its seed gives when it runs alone."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from tests.runtime.serving.conftest import REPO, Server, http

GRAPH = REPO / "tests" / "runtime" / "conductor" / "tiny_kv.yaml"   # shared with the conductor's KV tests
POOL_TOKENS = 8 * 16
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    plan = tmp_path_factory.mktemp("kv") / "tiny_kv.plan.bin"
    plan.write_bytes(compile_file(str(GRAPH), Options()).data)
    srv = Server(str(plan))
    try:
        srv.wait_ready(120)
        yield srv
    finally:
        assert srv.stop() == 0


def chat(server: Server, i: int, content: str | None = None, max_tokens: int = MAX_TOKENS) -> tuple[int, dict]:
    body = {"model": "tiny-kv", "messages": [{"role": "user", "content": content or f"kv {i}"}],
            "max_tokens": max_tokens, "temperature": 0.8, "seed": 100 + i, "ignore_eos": True}
    return http("POST", f"{server.url}/v1/chat/completions", body, timeout=60)


class UsageWatch:
    """Polls /metrics in the background: the highest KV usage seen while requests run."""

    def __init__(self, server: Server) -> None:
        self.server, self.peak, self._stop = server, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.server.metric("mstar_kv_cache_usage"))
            self._stop.wait(0.02)

    def __enter__(self) -> UsageWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_concurrent_requests_beyond_the_pool_all_complete_with_their_seeded_text(server: Server) -> None:
    n = 12
    alone = [chat(server, i) for i in range(n)]
    assert all(status == 200 for status, _ in alone), alone
    usage = alone[0][1]["usage"]
    assert usage["completion_tokens"] == MAX_TOKENS
    assert n * usage["total_tokens"] > 2 * POOL_TOKENS      # the pool cannot hold them all at once
    preempted = server.metric("mstar_kv_preemptions")
    held = server.metric("mstar_kv_admission_holds")
    with UsageWatch(server) as watch, ThreadPoolExecutor(n) as pool:
        together = list(pool.map(lambda i: chat(server, i), range(n)))
    assert [s for s, _ in together] == [200] * n, together
    texts = [body["choices"][0]["message"]["content"] for _, body in together]
    assert texts == [body["choices"][0]["message"]["content"] for _, body in alone]
    assert all(body["usage"]["completion_tokens"] == MAX_TOKENS for _, body in together)
    assert 0 < watch.peak <= 1.0
    assert server.metric("mstar_kv_preemptions") > preempted
    assert server.metric("mstar_kv_admission_holds") > held
    assert server.metric("mstar_kv_cache_usage") == 0.0
    assert 0.5 < server.metric("mstar_kv_cache_peak_usage") <= 1.0


def run_tokens(server: Server, ids: list[int], max_tokens: int) -> tuple[int, dict]:
    """The native task endpoint: no up-front length check, so the conductor must decide."""
    body = {"params": {"max_tokens": max_tokens}, "inputs": [{"type": "tokens", "ids": ids}]}
    return http("POST", f"{server.url}/v1/tasks/chat", body, timeout=30)


def test_chat_prompt_longer_than_the_pool_is_refused_up_front(server: Server) -> None:
    status, body = chat(server, 0, content="x" * (POOL_TOKENS + 10), max_tokens=4)
    assert status == 400 and "KV cache" in body["error"]["message"]


def test_a_prompt_longer_than_the_whole_pool_fails_clearly(server: Server) -> None:
    status, body = run_tokens(server, [7] * (POOL_TOKENS + 10), max_tokens=4)
    assert status == 500
    message = body["error"]["message"]
    assert "KV pool of node 'lm'" in message and f"{POOL_TOKENS + 10} tokens" in message, message
    status, body = run_tokens(server, [7, 8, 9], max_tokens=4)     # the server still serves afterwards
    assert status == 200 and len(body["token_ids"]) == 4
    assert server.metric("mstar_kv_cache_usage") == 0.0


def test_a_request_outgrowing_the_pool_fails_instead_of_hanging(server: Server) -> None:
    status, body = run_tokens(server, [5] * 100, max_tokens=POOL_TOKENS)
    assert status == 500
    assert f"KV pool of node 'lm' on rank 0 (8 blocks of 16 tokens)" in body["error"]["message"], body
    assert server.metric("mstar_kv_cache_usage") == 0.0
