"""Orpheus tiny served by `mstar-run` under three placements speaks the same audio.

`tp2`: the LM is sharded over two worker processes (a gloo tensor-parallel group); every
batch runs on both in step and the lead's tokens count. `disaggregated`: the prompt is
read on rank 0, then the request's KV cache and sampling state move worker to worker to
rank 1, which runs the decode loop and the vocoder. Same seed, same tokens, same audio.
"""
from __future__ import annotations

import openai
import pytest

from tests.runtime.serving.speech.conftest import ORPHEUS, serve

PLACEMENTS = ("tp2", "disaggregated")   # each compared with the single placement


REQUESTS = {"greedy": ("Hello there.", {"temperature": 0.0}),
            "seeded": ("Placement must not change a voice.", {"seed": 11, "temperature": 0.6})}


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    yield from serve(tmp_path_factory, "orpheus", "single")


@pytest.fixture(scope="module")
def reference(single) -> dict[str, bytes]:
    """What the single placement speaks for each request: the audio every other placement must equal
    (made here, whatever order the tests run in)."""
    return {name: speak(single, text, **body) for name, (text, body) in REQUESTS.items()}


@pytest.fixture(scope="module", params=PLACEMENTS)
def server(request, tmp_path_factory):
    yield from serve(tmp_path_factory, "orpheus", request.param)


def speak(server, text: str, **body) -> bytes:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    with client.audio.speech.with_streaming_response.create(
            model=ORPHEUS, voice="tara", input=text, response_format="pcm",
            extra_body={"max_tokens": 70, **body}) as resp:
        return b"".join(resp.iter_bytes())


def lm_params(server) -> dict[str, int]:
    """LM parameters each rank holding the LM reports in /v1/models."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    ranks = client.models.list().data[0].model_extra["ranks"]
    return {rank: nodes["lm"]["params"] for rank, nodes in ranks.items() if "lm" in nodes}


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_the_single_placement_speaks_the_same_audio_again(single, reference, name) -> None:
    text, body = REQUESTS[name]
    assert len(reference[name]) >= 2 * 2048, "at least one SNAC frame of 16-bit samples"
    assert speak(single, text, **body) == reference[name], "the reference itself must be repeatable"


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_audio_matches_the_single_rank_placement(server, reference, request, name) -> None:
    placement = request.node.callspec.params["server"]
    text, body = REQUESTS[name]
    audio = speak(server, text, **body)
    assert len(audio) >= 2 * 2048, "at least one SNAC frame of 16-bit samples"
    assert audio == reference[name], f"{placement} speaks differently from single ({len(audio)} vs {len(reference[name])} bytes)"


@pytest.mark.parametrize("server", ["tp2"], indirect=True)
def test_tp2_ranks_each_hold_a_shard_of_the_lm(server, single) -> None:
    """Under tp2 each rank reports fewer LM parameters than the whole model: a real shard."""
    whole, held = lm_params(single)["0"], lm_params(server)
    assert sorted(held) == ["0", "1"]
    assert all(0.4 * whole < n < 0.7 * whole for n in held.values()), (held, whole)


@pytest.mark.parametrize("server", ["disaggregated"], indirect=True)
def test_disaggregated_ranks_each_hold_the_whole_lm(server, single) -> None:
    """Prefill on rank 0, decode on rank 1: both run the whole LM, unsharded."""
    whole, held = lm_params(single)["0"], lm_params(server)
    assert held == {"0": whole, "1": whole}, (held, whole)
