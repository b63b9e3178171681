"""Request bodies parsed once into their endpoint's schema: typed fields, and a 400 that names the field."""
from __future__ import annotations

import json

import pytest

from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.schemas import ChatCompletionBody, SpeechBody, TaskBody, TokensInput, parse_body

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _error(raw: bytes | dict, schema: type) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_body(raw if isinstance(raw, bytes) else json.dumps(raw).encode(), schema)
    assert info.value.status == 400
    return info.value


def test_a_good_chat_body_is_typed_with_defaults() -> None:
    body = parse_body(json.dumps({**CHAT, "temperature": 1, "stop": "x", "user": "ignored"}).encode(),
                      ChatCompletionBody)
    assert body.messages[0].role == "user" and body.messages[0].content == "hi"
    assert body.temperature == 1.0 and isinstance(body.temperature, float) and body.stop == "x"
    assert body.n == 1 and body.stream is False and body.stream_options is None and body.audio is None


@pytest.mark.parametrize("change, param", [
    ({"model": 5}, "model"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": 5}]}, "messages[1]"),
    ({"messages": [{"content": "a"}]}, "messages[0]"),
    ({"stream": "yes"}, "stream"),
    ({"n": "3"}, "n"),
    ({"stop": ["a", 1]}, "stop"),
    ({"stop_token_ids": [-1, "a"]}, "stop_token_ids"),
    ({"top_k": True}, "top_k"),
    ({"seed": 1.5}, "seed"),
    ({"audio": {"voice": 5}}, "audio.voice"),
    ({"audio": {"format": None}}, "audio.format"),
    ({"stream_options": {"include_usage": 5}}, "stream_options.include_usage"),
])
def test_a_chat_field_that_does_not_fit_is_named(change, param) -> None:
    assert _error({**CHAT, **change}, ChatCompletionBody).param == param


def test_a_missing_field_and_the_body_itself() -> None:
    missing = _error({"messages": CHAT["messages"]}, ChatCompletionBody)
    assert missing.param == "model" and missing.message == "'model' must be a string"
    whole = _error(b"[1, 2]", ChatCompletionBody)
    assert whole.param is None and whole.message == "the request body must be a JSON object"


def test_a_field_without_a_message_of_its_own_is_said_for_people() -> None:
    err = _error({**CHAT, "temperature": "hot"}, ChatCompletionBody)
    assert (err.param, err.message) == ("temperature", "'temperature' must be a number, got a string")


@pytest.mark.parametrize("raw", [b"{not json", b'{"model": "m", "temperature": NaN}', b'{"top_p": Infinity}'])
def test_json_is_strict(raw) -> None:
    err = _error(raw, ChatCompletionBody)
    assert err.param is None and err.message.startswith("the body is not valid JSON")


def test_task_inputs_are_a_tagged_union() -> None:
    body = parse_body(b'{"params": {"max_tokens": 3}, "inputs": [{"type": "tokens", "ids": [1, 2]}]}', TaskBody)
    assert body.params == {"max_tokens": 3} and body.inputs == [TokensInput([1, 2])]
    assert parse_body(b"{}", TaskBody).inputs == []
    for item in ({"type": "x"}, {"type": "tokens", "ids": [-1]}, {"type": "text"}, 5):
        assert _error({"inputs": [{"type": "text", "text": "a"}, item]}, TaskBody).param == "inputs[1]"
    assert _error(b'{"params": {"temperature": 1e400}}', TaskBody).param == "params"


def test_speech_fields_keep_their_messages() -> None:
    assert _error({"model": "m", "input": 5}, SpeechBody).message == "'input' must be a non-empty string"
    assert _error({"model": "m", "input": "hi", "speed": "x"}, SpeechBody).message == "only speed 1.0 is supported"
