"""The chat bench's load client against a real tiny `mstar-run`: forced lengths, TTFT at the first content token."""
from __future__ import annotations

from typing import Iterator

import pytest

from bench.openai_load import ChatJob, chat_burst, model_card
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
