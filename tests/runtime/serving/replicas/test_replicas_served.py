"""SmolLM2 tiny on two data-parallel replicas (`replicas` placement) served by a real `mstar-run`
with two workers: concurrent requests spread over both ranks and answer exactly as on one rank."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import pytest

from tests.runtime.serving.conftest import Server, http, serve_tiny

MODEL = "smollm2-135m-instruct"
N = 8


def _serve(tmp_path_factory: pytest.TempPathFactory, placement: str) -> Iterator[Server]:
    yield from serve_tiny(tmp_path_factory, "smollm2", placement, timeout=60)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory) -> Iterator[Server]:
    yield from _serve(tmp_path_factory, "replicas")


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Iterator[Server]:
    yield from _serve(tmp_path_factory, "single")


def _chat(server: Server, i: int) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"tell me about {i} cats"}],
            "max_tokens": 6, "temperature": 0.8, "seed": 100 + i, "ignore_eos": True}
    status, answer = http("POST", f"{server.url}/v1/chat/completions", body)
    assert status == 200, answer
    return answer["choices"][0]["message"]["content"]


def _served(server: Server) -> dict[str, float]:
    """rank -> requests that ended after running `lm` there (from /metrics)."""
    _, text = http("GET", f"{server.url}/metrics")
    out = {}
    for line in text.splitlines():
        if line.startswith("mstar_rank_requests_total{") and 'node="lm"' in line:
            rank = line.split('rank="', 1)[1].split('"', 1)[0]
            out[rank] = float(line.rsplit(" ", 1)[1])
    return out


def test_models_lists_the_node_on_both_ranks(replicas) -> None:
    _, models = http("GET", f"{replicas.url}/v1/models")
    assert {r: set(nodes) for r, nodes in models["data"][0]["ranks"].items()} == {"0": {"lm"}, "1": {"lm"}}


def test_concurrent_requests_use_both_replicas_and_match_one_rank(replicas, single) -> None:
    with ThreadPoolExecutor(N) as pool:
        spread = list(pool.map(lambda i: _chat(replicas, i), range(N)))
    alone = [_chat(single, i) for i in range(N)]
    assert spread == alone
    served = _served(replicas)
    assert set(served) == {"0", "1"} and sum(served.values()) == N
    assert min(served.values()) >= 2            # by load, not all on the first free replica
    assert _served(single) == {"0": N}
