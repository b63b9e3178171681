"""Faults against a real `mstar-run` (tiny seeded model): bad requests, a killed worker, a remote
worker joining over TCP, SIGTERM draining."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.runtime.serving.conftest import REPO, Server, compile_plan, free_port, http

MODEL = "smollm2-135m-instruct"


def chat(max_tokens: int = 4, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, **extra}


@pytest.fixture(scope="module")
def server(plan_dir):
    srv = Server(compile_plan(plan_dir, "smollm2", preset="tiny"))
    try:
        srv.wait_ready(60)
        yield srv
    finally:
        srv.stop()


BAD = [
    (b"{not json", 400),
    (b"[1, 2]", 400),
    ({"model": MODEL}, 400),
    ({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}, 404),
    ({**chat(), "max_tokens": 0}, 400),
    ({**chat(), "max_tokens": "ten"}, 400),
    ({**chat(), "temperature": 7}, 400),
    ({**chat(), "top_p": -1}, 400),
    ({**chat(), "messages": [{"role": "user", "content": 5}]}, 400),
    ({**chat(), "stream": "yes"}, 400),
    ({**chat(), "n": 17}, 400),
    (b"x" * (17 << 20), 413),
]


@pytest.mark.parametrize("body,status", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_request_is_an_openai_error(server, body, status) -> None:
    got, answer = http("POST", f"{server.url}/v1/chat/completions", body)
    assert got == status
    assert set(answer["error"]) == {"message", "type", "param", "code"} and answer["error"]["message"]


def test_unknown_task_and_route(server) -> None:
    assert http("POST", f"{server.url}/v1/tasks/paint", {})[0] == 404
    status, answer = http("POST", f"{server.url}/v1/tasks/chat", {"params": {"max_tokens": 3},
                                                                  "inputs": [{"type": "tokens", "ids": [1, 2, 3]}]})
    assert status == 200 and len(answer["token_ids"]) == 3 and answer["finish_reason"] == "length"


def test_a_thousand_bad_requests_leave_it_healthy(server) -> None:
    def hammer(n: int) -> None:
        for i in range(n):
            body, status = BAD[i % (len(BAD) - 1)]
            assert http("POST", f"{server.url}/v1/chat/completions", body)[0] == status
    threads = [threading.Thread(target=hammer, args=(250,)) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert http("GET", f"{server.url}/health")[0] == 200
    status, answer = http("POST", f"{server.url}/v1/chat/completions", chat())
    assert status == 200 and answer["usage"]["completion_tokens"] == 4


def test_killed_worker_fails_its_requests_fast_and_is_restarted(server) -> None:
    pid = http("GET", f"{server.url}/health")[1]["worker_pids"]["0"]
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(zip(("status", "body"), http(
        "POST", f"{server.url}/v1/chat/completions", chat(max_tokens=2000)))))
    t.start()
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    t.join(60)   # liveness, not speed: without failure detection it would wait for 2,000 tokens of a dead worker
    assert not t.is_alive()
    assert result["status"] >= 500 and "died" in result["body"]["error"]["message"]
    deadline = time.monotonic() + 60
    while http("GET", f"{server.url}/health")[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    health = http("GET", f"{server.url}/health")[1]
    assert health["worker_pids"]["0"] != pid
    assert http("POST", f"{server.url}/v1/chat/completions", chat())[0] == 200
    assert server.metric("mstar_worker_restarts") == 1


def test_remote_worker_joins_over_tcp_and_sigterm_drains(plan_dir) -> None:
    plan = compile_plan(plan_dir, "smollm2", preset="tiny")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    keys = plan_dir / "remote-keys"
    subprocess.run([sys.executable, "-m", "runtime.entrypoints.cli", "keygen", "--ranks", "1", "--out", str(keys)], cwd=REPO,
                   check=True, capture_output=True)
    srv = Server(plan, "--worker-endpoint", endpoint, "--remote-ranks", "0", "--keys", str(keys))
    worker = subprocess.Popen([sys.executable, "-m", "runtime.entrypoints.cli", "worker", "--conductor", endpoint,
                               "--rank", "0", "--key", str(keys / "rank-0.json"), "--log-level", "warning", plan],
                              cwd=REPO)
    try:
        srv.wait_ready(60)
        assert http("GET", f"{srv.url}/health")[1]["worker_pids"]["0"] == worker.pid
        result: dict = {}
        t = threading.Thread(target=lambda: result.update(zip(("status", "body"), http(
            "POST", f"{srv.url}/v1/chat/completions", chat(max_tokens=64)))))
        t.start()
        time.sleep(0.3)
        assert srv.stop() == 0          # SIGTERM: drains the running request, then exits
        t.join(30)
        assert result["status"] == 200 and result["body"]["usage"]["completion_tokens"] == 64
        assert worker.wait(30) == 0     # the conductor told the remote worker to shut down
    finally:
        srv.stop()
        if worker.poll() is None:
            worker.kill()
