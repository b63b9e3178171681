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

PLACEMENTS = ("single", "tp2", "disaggregated")


@pytest.fixture(scope="module", params=PLACEMENTS)
def server(request, tmp_path_factory):
    yield from serve(tmp_path_factory, "orpheus", request.param)


def speak(server, text: str, **body) -> bytes:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    with client.audio.speech.with_streaming_response.create(
            model=ORPHEUS, voice="tara", input=text, response_format="pcm",
            extra_body={"max_tokens": 70, **body}) as resp:
        return b"".join(resp.iter_bytes())


REQUESTS = {"greedy": ("Hello there.", {"temperature": 0.0}),
            "seeded": ("Placement must not change a voice.", {"seed": 11, "temperature": 0.6})}
_AUDIO: dict[tuple[str, str], bytes] = {}


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_audio_matches_the_single_rank_placement(server, request, name) -> None:
    placement = request.node.callspec.params["server"]
    text, body = REQUESTS[name]
    audio = speak(server, text, **body)
    assert len(audio) >= 2 * 2048, "at least one SNAC frame of 16-bit samples"
    _AUDIO[(placement, name)] = audio
    reference = _AUDIO.get(("single", name))
    assert reference is not None, "the single placement runs first"
    assert audio == reference, f"{placement} speaks differently from single ({len(audio)} vs {len(reference)} bytes)"


def test_tp2_ranks_each_hold_a_shard_of_the_lm(server, request) -> None:
    """Under tp2 each rank reports fewer LM parameters than the whole model: a real shard."""
    placement = request.node.callspec.params["server"]
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    ranks = client.models.list().data[0].model_extra["ranks"]
    held = {rank: nodes["lm"]["params"] for rank, nodes in ranks.items() if "lm" in nodes}
    _PARAMS[placement] = held
    if placement == "tp2":
        whole = _PARAMS["single"]["0"]
        assert sorted(held) == ["0", "1"]
        assert all(0.4 * whole < n < 0.7 * whole for n in held.values()), (held, whole)


_PARAMS: dict[str, dict[str, int]] = {}
