"""Orpheus tiny with rank 1 on another host: `disaggregated` (the request's KV cache moves from
rank 0 to rank 1 over the veth) and `tp2` (the LM's gloo collectives run over it). Same seed,
same audio as the single-rank plan, bit for bit (test_orpheus_placements.py shows the same on one
host; here the bytes cross a real interface, counted at its counters)."""
from __future__ import annotations

from typing import Iterator

import openai
import pytest

from tests.runtime.serving.conftest import compile_plan, serve
from tests.runtime.serving.network.conftest import Cluster, serve_across
from tests.runtime.serving.speech.conftest import ORPHEUS

TEXT, BODY = "Hello there.", {"temperature": 0.0, "max_tokens": 70}


def speak(client: openai.OpenAI) -> bytes:
    with client.audio.speech.with_streaming_response.create(
            model=ORPHEUS, voice="tara", input=TEXT, response_format="pcm", extra_body=BODY) as resp:
        return b"".join(resp.iter_bytes())


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> bytes:
    """The single-rank plan's audio, on this machine's own loopback."""
    plan = compile_plan(tmp_path_factory.mktemp("orpheus-single"), "orpheus", "tiny", "single")
    for server in serve(plan):
        return speak(openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120))
    raise AssertionError("unreachable")


@pytest.fixture(scope="module", params=["disaggregated", "tp2"])
def cluster(request, net, tmp_path_factory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp(f"orpheus-{request.param}")
    yield from serve_across(net, tmp, compile_plan(tmp, "orpheus", "tiny", request.param), {1: 1})


def test_audio_across_hosts_matches_the_single_rank_plan(cluster: Cluster, reference: bytes) -> None:
    before = cluster.veth_bytes()
    audio = cluster.call(lambda: speak(cluster.client()))
    crossed = cluster.veth_bytes() - before
    assert len(audio) >= 2 * 2048, "at least one SNAC frame of 16-bit samples"
    assert audio == reference, f"{len(audio)} vs {len(reference)} bytes"
    # the audio itself leaves host 0 for the client on host 0 through loopback, so what crossed is
    # rank traffic: a KV cache (disaggregated) or one all-reduce per layer per token (tp2)
    assert crossed > 20_000, crossed


def test_rank_1_is_on_the_other_host(cluster: Cluster) -> None:
    status, health = cluster.http("GET", "/health")
    assert status == 200 and health["status"] == "ok"
    ranks = cluster.call(lambda: cluster.client().models.list().data[0].model_extra["ranks"])
    assert sorted(ranks) == ["0", "1"]
