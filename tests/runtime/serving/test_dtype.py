"""The plan's per-node dtype is what the worker builds and what `/v1/models` reports:
a tiny bf16 smollm2 plan is served by a real `mstar-run` and answers a chat."""
from __future__ import annotations

import openai
import pytest
import torch

from mstar_compiler.plan import load_plan
from runtime.worker.loader import build_module
from tests.runtime.serving.conftest import Server, compile_plan, http

MODEL = "smollm2-135m-instruct"


def test_build_module_casts_weights_and_kv_cache_to_the_node_dtype(plan_dir) -> None:
    torch.manual_seed(0)
    for preset, dtype in (("tiny", torch.float32), ("tiny-bf16", torch.bfloat16)):
        node = load_plan(compile_plan(plan_dir, "smollm2", preset)).node("lm")
        module = build_module(node, None)
        assert {p.dtype for p in module.parameters()} == {dtype}
        cache = module.make_kv_cache(4, 16)
        assert cache.dtype == dtype and {t.dtype for t in cache.k + cache.v} == {dtype}


@pytest.fixture(scope="module")
def server(plan_dir):
    srv = Server(compile_plan(plan_dir, "smollm2", "tiny-bf16"))
    try:
        srv.wait_ready(120)
        yield srv
    finally:
        assert srv.stop() == 0


def test_bf16_plan_answers_a_chat_and_reports_its_dtype(server) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    card = client.models.list().data[0]
    assert card.model_extra["dtype"] == {"lm": "bf16"}
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=6, temperature=0)
    assert out.usage.completion_tokens >= 1
    assert out.choices[0].finish_reason in ("stop", "length")


def test_random_weights_are_reported_loudly(server) -> None:
    """The tiny preset declares `random_weights: true`; /v1/models and /health say which nodes have them."""
    card = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0).models.list().data[0]
    assert card.model_extra["weights"] == {"lm": "seed:0 (random weights)"}
    assert card.model_extra["random_weights"] == ["lm"]
    assert http("GET", f"{server.url}/health")[1]["random_weights"] == ["lm"]
