"""/v1/realtime's conversation on a real Qwen3-Omni tiny server (the package's shared `omni_single`), over a
real WebSocket: every response reads the whole conversation (proved by the chat endpoint answering the same
turns, audio as files, with the same greedy text), items are created, deleted and truncated, and function
tools make a call round trip."""
from __future__ import annotations

import base64
import json

import jsonschema
import openai

from runtime.entrypoints.http.audio_io import wav
from runtime.models.qwen3_omni.mel_featuriser import PCM_RATE
from tests.runtime.models.qwen3_omni.test_mel_featuriser import utterance
from tests.runtime.serving.speech.conftest import OMNI
from tests.runtime.serving.speech.test_omni_realtime import MAX_TOKENS, Client, session

TEXT_ONLY = {"modalities": ["text"], "temperature": 0, "max_response_output_tokens": MAX_TOKENS}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
           "required": ["city"], "additionalProperties": False}


def _audio_part(pcm: bytes) -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav(pcm, PCM_RATE)).decode(),
                                                   "format": "wav"}}


def _chat(server, messages: list[dict]) -> str:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    out = client.chat.completions.create(model=OMNI, messages=messages, max_tokens=MAX_TOKENS, temperature=0.0)
    return out.choices[0].message.content


async def _heard(client: Client, pcm: bytes) -> dict:
    await client.speak(pcm)
    await client.send("input_audio_buffer.commit")
    return (await client.until("conversation.item.created"))[-1]["item"]


async def _respond(client: Client) -> list[dict]:
    await client.send("response.create")
    return await client.until("response.done")


def _text(events: list[dict]) -> str:
    return next(e["text"] for e in events if e["type"] == "response.text.done")


def test_a_third_turn_is_answered_from_the_whole_conversation(omni_single):
    first, third = utterance(2.5, seed=4), utterance(2.0, seed=5)

    async def body(client: Client) -> tuple[str, str, str, list[dict]]:
        await client.send("session.update", session={**TEXT_ONLY, "instructions": "Be brief."})
        await client.until("session.updated")
        await _heard(client, first)
        one = _text(await _respond(client))
        await client.send("conversation.item.create", item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "And tomorrow?"}]})
        await client.until("conversation.item.created")
        two = _text(await _respond(client))
        await _heard(client, third)
        events = await _respond(client)
        return one, two, _text(events), events

    one, two, three, events = session(omni_single, body)
    assert one and two and three
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert len(added) == 1 and added[0]["item"]["role"] == "assistant"
    assert all(e["item_id"] == added[0]["item"]["id"] for e in events if e["type"] == "response.text.delta")
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == three
    conversation = [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": [_audio_part(first)]}, {"role": "assistant", "content": one},
                    {"role": "user", "content": "And tomorrow?"}, {"role": "assistant", "content": two},
                    {"role": "user", "content": [_audio_part(third)]}]
    assert _chat(omni_single, conversation) == three
    assert _chat(omni_single, conversation[:1] + conversation[-1:]) != three      # the history changed it


def test_a_turns_runs_do_not_grow_with_the_turns_before_it(omni_single):
    """Each answer reads the whole conversation in two items (the history with every utterance's rows, then
    the rest): one encoder Run passing the rows on, whatever the turn, where one per utterance used to run."""
    encoder = 'mstar_batch_run_ms_count{node="audio_enc"}'

    async def body(client: Client) -> tuple[list[float], list[float]]:
        await client.send("session.update", session=TEXT_ONLY)
        await client.until("session.updated")
        runs, hits = [], []
        for turn in range(3):
            await _heard(client, utterance(1.0, seed=20 + turn))
            before, hit = omni_single.metric(encoder), _hit_tokens(omni_single)
            await _respond(client)
            runs.append(omni_single.metric(encoder) - before)
            hits.append(_hit_tokens(omni_single) - hit)
        return runs, hits

    runs, hits = session(omni_single, body)
    assert runs == [1, 1, 1]
    assert 0 < hits[1] < hits[2]      # the history, utterances included, comes from the prefix cache


def _hit_tokens(server) -> float:
    return server.metric("mstar_prefix_cache_hit_tokens_total")      # the thinker's: the one cache it reports


def test_an_input_audio_item_is_heard_as_the_committed_buffer_is(omni_single):
    pcm = utterance(2.5, seed=8)

    async def body(client: Client) -> tuple[str, str, dict, list[dict]]:
        await client.send("session.update", session=TEXT_ONLY)
        await client.until("session.updated")
        heard = await _heard(client, pcm)
        events = await _respond(client)
        for item in (heard["id"], events[-1]["response"]["output"][0]["id"]):     # an empty conversation again
            await client.send("conversation.item.delete", item_id=item)
            await client.until("conversation.item.deleted")
        committed = _text(events)
        await client.send("conversation.item.create", item={"type": "message", "role": "user", "content": [
            {"type": "input_audio", "audio": base64.b64encode(pcm).decode()}]})
        created = (await client.until("conversation.item.created"))[-1]["item"]
        bad = []
        for audio in ("not base64!", base64.b64encode(pcm[:101]).decode(), base64.b64encode(pcm[:200]).decode()):
            await client.send("conversation.item.create", item={"type": "message", "role": "user", "content": [
                {"type": "input_audio", "audio": audio}]})
            bad.append((await client.until("error"))[-1]["error"])
        return committed, _text(await _respond(client)), created, bad

    committed, item, created, bad = session(omni_single, body)
    assert created["content"] == [{"type": "input_audio", "transcript": None}]
    assert committed and item == committed      # greedy: the same rows in the same prompt give the same answer
    assert [e["param"] for e in bad] == ["item.content[0].audio"] * 3
    assert [e["code"] for e in bad] == ["invalid_audio"] * 3 and "0.1 to 8 s" in bad[2]["message"]


def test_items_are_created_in_place_deleted_and_truncated(omni_single):
    async def body(client: Client) -> dict:
        seen = {}
        await client.send("conversation.item.create", item={
            "id": "item_b", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "b"}]})
        seen["b"] = (await client.recv())
        await client.send("conversation.item.create", previous_item_id="root", item={
            "id": "item_a", "type": "message", "role": "system", "content": [{"type": "input_text", "text": "a"}]})
        seen["a"] = await client.recv()
        await client.send("conversation.item.delete", item_id="item_b")
        seen["deleted"] = await client.recv()
        await client.send("conversation.item.delete", item_id="item_b")
        seen["again"] = await client.recv()
        await client.send("conversation.item.truncate", item_id="item_a", content_index=0, audio_end_ms=10)
        seen["not_audio"] = await client.recv()
        await client.send("session.update", session={"modalities": ["audio", "text"], "voice": "ethan",
                                                     "max_response_output_tokens": MAX_TOKENS})
        await client.until("session.updated")
        await _heard(client, utterance(1.0, seed=6))
        done = (await _respond(client))[-1]["response"]["output"][0]
        seen["answer"] = done
        await client.send("conversation.item.truncate", item_id=done["id"], content_index=0, audio_end_ms=10 ** 7)
        seen["too_far"] = await client.recv()
        await client.send("conversation.item.truncate", item_id=done["id"], content_index=0, audio_end_ms=20)
        seen["truncated"] = await client.recv()
        return seen

    seen = session(omni_single, body)
    assert seen["b"]["type"] == "conversation.item.created" and seen["b"]["previous_item_id"] is None
    assert seen["a"]["previous_item_id"] is None and seen["a"]["item"]["id"] == "item_a"
    assert seen["deleted"] == {**seen["deleted"], "type": "conversation.item.deleted", "item_id": "item_b"}
    assert seen["again"]["type"] == "error" and seen["again"]["error"]["code"] == "item_not_found"
    assert seen["not_audio"]["type"] == "error" and seen["not_audio"]["error"]["param"] == "item_id"
    assert seen["answer"]["role"] == "assistant" and seen["answer"]["content"][0]["type"] == "audio"
    assert seen["too_far"]["type"] == "error" and seen["too_far"]["error"]["param"] == "audio_end_ms"
    assert seen["truncated"]["type"] == "conversation.item.truncated" and seen["truncated"]["audio_end_ms"] == 20


def test_a_function_call_round_trip(omni_single):
    pcm = utterance(2.0, seed=7)
    tools = [{"type": "function", "name": "get_weather", "description": "weather in a city", "parameters": WEATHER}]

    async def body(client: Client) -> tuple[list[dict], str, str]:
        # a call of random bytes is long: room for it (the grammar ends the answer when the call closes)
        await client.send("session.update", session={**TEXT_ONLY, "tools": tools, "tool_choice": "required",
                                                     "max_response_output_tokens": 400})
        await client.until("session.updated")
        await _heard(client, pcm)
        called = await _respond(client)
        done = next(e for e in called if e["type"] == "response.function_call_arguments.done")
        await client.send("conversation.item.create", item={
            "type": "function_call_output", "call_id": done["call_id"], "output": '{"temp_c": 21}'})
        await client.until("conversation.item.created")
        await client.send("session.update", session={"tools": [], "tool_choice": "none",
                                                     "max_response_output_tokens": MAX_TOKENS})
        await client.until("session.updated")
        return called, done["arguments"], _text(await _respond(client))

    called, arguments, answer = session(omni_single, body)
    types = [e["type"] for e in called]
    assert "response.text.delta" not in types and types.count("response.function_call_arguments.delta") == 1
    assert called[-1]["response"]["output"][0]["type"] == "function_call"
    jsonschema.validate(json.loads(arguments), WEATHER)
    call = json.dumps({"name": "get_weather", "arguments": json.loads(arguments)}, ensure_ascii=False)
    assert answer == _chat(omni_single, [
        {"role": "user", "content": [_audio_part(pcm)]},
        {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
        {"role": "user", "content": '<tool_response>\n{"temp_c": 21}\n</tool_response>'}])


def test_auto_tools_with_speech_and_a_bad_tool_are_error_events_naming_the_field(omni_single):
    async def body(client: Client) -> tuple[dict, dict, dict]:
        tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
        await client.send("session.update", session={"modalities": ["audio", "text"], "tools": [tool]})
        spoken = await client.recv()
        await client.send("session.update", session={"modalities": ["text"], "tools": [{**tool, "name": "a b"}]})
        bad = await client.recv()
        await client.send("session.update", session={"modalities": ["text"], "tools": [tool]})
        return spoken, bad, await client.recv()

    spoken, bad, ok = session(omni_single, body)
    assert spoken["type"] == "error" and spoken["error"]["param"] == "session.tool_choice"
    assert bad["type"] == "error" and bad["error"]["param"] == "session.tools[0].name"
    assert ok["type"] == "session.updated" and ok["session"]["tools"][0]["name"] == "f"


def test_the_graphs_limits_bound_tools_and_items(omni_single):
    """The tiny preset's params: max_tools 8, max_conversation_items 24 (graphs/qwen3_omni.yaml)."""
    tool = {"type": "function", "parameters": {"type": "object"}}

    async def body(client: Client) -> tuple[dict, dict, int]:
        await client.send("session.update", session={"tools": [{**tool, "name": f"f{i}"} for i in range(9)]})
        too_many = (await client.until("error"))[-1]["error"]
        created = 0
        while True:
            await client.send("conversation.item.create", item={
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]})
            event = await client.recv()
            if event["type"] == "error":
                return too_many, event["error"], created
            created += 1

    too_many, full, created = session(omni_single, body)
    assert too_many["param"] == "session.tools" and "at most 8 tools (param max_tools)" in too_many["message"]
    assert created == 24 and full["code"] == "conversation_full" and "max_conversation_items" in full["message"]
