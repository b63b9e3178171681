"""Qwen3-Omni tiny `thinker_talker` with the talker, code predictor and code2wav on another host:
the thinker's streaming edge to the talker (fixed 1: an item per token) crosses the veth as it is
produced. Same seed, same speech as the single-rank plan, bit for bit."""
from __future__ import annotations

from typing import Iterator

import openai
import pytest

from tests.runtime.serving.conftest import compile_plan, serve
from tests.runtime.serving.network.conftest import Cluster, serve_across
from tests.runtime.serving.speech.conftest import OMNI


def speech(client: openai.OpenAI) -> bytes:
    with client.audio.speech.with_streaming_response.create(
            model=OMNI, voice="ethan", input="Hello there.", response_format="pcm", extra_body={"seed": 2}) as resp:
        return b"".join(resp.iter_bytes())


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> bytes:
    plan = compile_plan(tmp_path_factory.mktemp("omni-single"), "qwen3_omni", "tiny", "single")
    for server in serve(plan):
        return speech(openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120))
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def cluster(net, tmp_path_factory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("omni-split")
    yield from serve_across(net, tmp, compile_plan(tmp, "qwen3_omni", "tiny", "thinker_talker"), {1: 1})


def test_speech_across_hosts_matches_the_single_rank_plan(cluster: Cluster, reference: bytes) -> None:
    rx, _ = cluster.net.counters(1)
    pcm = cluster.call(lambda: speech(cluster.client()))
    assert len(pcm) > 0 and pcm == reference, f"{len(pcm)} vs {len(reference)} bytes"
    # the thinker's hidden states stream to rank 1 item by item (plus its RunBatches)
    assert cluster.net.counters(1)[0] - rx > 20_000
