"""Bad requests against a real `mstar-run` (tiny SmolLM2: vocabulary 512, context 2,048): every
param is bounded before admission (400, OpenAI error body), bad requests sent in parallel with
good ones leave the good ones' outputs as they are alone, and a timeout is an error, not a 200."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.runtime.serving.conftest import Server, compile_plan, http

MODEL = "smollm2-135m-instruct"


def chat(content: str = "hi", max_tokens: int = 8, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, **extra}


@pytest.fixture(scope="module")
def server(plan_dir):
    srv = Server(compile_plan(plan_dir, "smollm2", preset="tiny"), env={"OMP_NUM_THREADS": "1"})
    try:
        srv.wait_ready(60)
        yield srv
    finally:
        srv.stop()


CHAT_BAD = {
    "top_k 2**63": chat(top_k=2**63),
    "top_k 2**64": chat(top_k=2**64),
    "top_k > vocab": chat(top_k=513),
    "role wizard": {**chat(), "messages": [{"role": "wizard", "content": "hi"}]},
    "audio part": {**chat(), "messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
    "context": chat("x" * 2100),
    "prompt + max_tokens": chat(max_tokens=2040),
    "seed 2**64": chat(seed=2**64),
}
RAW_BAD = {
    "NaN temperature": b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
    "Infinity top_p": b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "top_p": Infinity}',
    "1e400 temperature": b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "temperature": 1e400}',
}
TASK_BAD = {
    "id >= vocab": {"params": {"max_tokens": 3}, "inputs": [{"type": "tokens", "ids": [1, 512]}]},
    "id 2**64": {"params": {"max_tokens": 3}, "inputs": [{"type": "tokens", "ids": [2**64]}]},
    "context": {"params": {"max_tokens": 100}, "inputs": [{"type": "tokens", "ids": [1] * 2000}]},
    "NaN param": {"params": {"max_tokens": 3, "temperature": float("nan")}, "inputs": []},
}


def is_openai_error(status: int, body, want: int = 400) -> bool:
    return status == want and isinstance(body, dict) and set(body["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("name", CHAT_BAD)
def test_bad_chat_is_a_400(server, name) -> None:
    status, body = http("POST", f"{server.url}/v1/chat/completions", CHAT_BAD[name])
    assert is_openai_error(status, body), (status, body)


@pytest.mark.parametrize("name", RAW_BAD)
def test_non_finite_json_numbers_are_a_400(server, name) -> None:
    status, body = http("POST", f"{server.url}/v1/chat/completions", RAW_BAD[name] % MODEL.encode())
    assert is_openai_error(status, body), (status, body)


@pytest.mark.parametrize("name", TASK_BAD)
def test_bad_task_is_a_400(server, name) -> None:
    body = TASK_BAD[name]
    raw = json.dumps(body).encode() if name != "NaN param" else json.dumps(body, allow_nan=True).encode()
    status, answer = http("POST", f"{server.url}/v1/tasks/chat", raw)
    assert is_openai_error(status, answer), (status, answer)


def test_context_error_names_the_limit(server) -> None:
    status, body = http("POST", f"{server.url}/v1/chat/completions", chat(max_tokens=2040))
    assert body["error"]["code"] == "context_length_exceeded" and "2048" in body["error"]["message"]


def test_bad_requests_in_parallel_leave_good_outputs_as_alone(server) -> None:
    goods = [chat(f"question number {i}", max_tokens=12) for i in range(4)]
    alone = [http("POST", f"{server.url}/v1/chat/completions", g)[1]["choices"][0]["message"]["content"]
             for g in goods]
    bads = [CHAT_BAD["top_k 2**64"], CHAT_BAD["role wizard"], CHAT_BAD["top_k 2**63"], CHAT_BAD["context"]]
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(http, "POST", f"{server.url}/v1/chat/completions", b)
                   for pair in zip(bads, goods) for b in pair]
        results = [f.result() for f in futures]
    for (bad_status, bad_body), (good_status, good_body), want in zip(results[::2], results[1::2], alone):
        assert is_openai_error(bad_status, bad_body)
        assert good_status == 200 and good_body["choices"][0]["message"]["content"] == want
    assert http("GET", f"{server.url}/health")[0] == 200


def test_timeout_is_an_openai_error_not_a_200(plan_dir) -> None:
    srv = Server(compile_plan(plan_dir, "smollm2", preset="tiny"), "--request-timeout", "1",
                 env={"OMP_NUM_THREADS": "1"})
    try:
        srv.wait_ready(60)
        status, body = http("POST", f"{srv.url}/v1/chat/completions", chat(max_tokens=2000, ignore_eos=True))
        assert is_openai_error(status, body, 504) and body["error"]["code"] == "timeout", (status, body)
        status, body = http("POST", f"{srv.url}/v1/chat/completions", chat(max_tokens=2000, ignore_eos=True,
                                                                           stream=True))
        assert status == 200 and '"code": "timeout"' in body and '"finish_reason": "timeout"' not in body
    finally:
        srv.stop()
