"""Chat's tools without a model: the prompt they make, the calls read back, streamed and whole, and the
400s of malformed tools, choices and schemas."""
from __future__ import annotations

import json

import pytest

from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.schemas import ResponseFormat, ToolDef, convert_body
from runtime.entrypoints.http.tools import (
    ToolCallStream, check_tools, prompt_messages, renders_tools, response_grammar, split_calls)
from runtime.text.chat_template import ChatTemplate

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
NAMES = frozenset({"get_weather"})
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _tools(*tools: dict) -> list[ToolDef]:
    return [convert_body(t, ToolDef) for t in tools]


def test_a_whole_answer_splits_into_content_and_calls() -> None:
    content, calls = split_calls(f"Let me look.\n{CALL}", NAMES)
    assert content == "Let me look."
    assert [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [("function", "get_weather", {"city": "Paris"})]
    assert calls[0]["id"].startswith("call_")


def test_blocks_that_are_not_calls_of_declared_functions_stay_text() -> None:
    for text in ('<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>',      # not declared
                 "<tool_call>\n{not json}\n</tool_call>", "<tool_call>\n{\"name\": \"get_weather\""):   # cut
        assert split_calls(text, NAMES) == (text, [])


@pytest.mark.parametrize("step", [1, 2, 5, 13])
def test_streamed_pieces_give_what_the_whole_answer_gives(step: int) -> None:
    text = f"Checking.{CALL}\n{CALL}"
    stream, content, calls = ToolCallStream(NAMES), "", []
    for i in range(0, len(text), step):
        piece, found = stream.push(text[i:i + step])
        assert "<tool" not in piece          # nothing of a call leaks out as content
        content, calls = content + piece, calls + found
    content += stream.finish()
    whole_content, whole_calls = split_calls(text, NAMES)
    assert content.strip() == whole_content
    assert [c["function"] for c in calls] == [c["function"] for c in whole_calls]


def test_an_unclosed_call_comes_out_as_content_at_the_end() -> None:
    stream = ToolCallStream(NAMES)
    assert stream.push("Hi <tool_") == ("Hi ", [])
    assert stream.push('call>\n{"name"') == ("", [])
    assert stream.finish() == '<tool_call>\n{"name"'


def test_a_template_without_tools_gets_them_in_a_hermes_system_message() -> None:
    use, _ = check_tools(_tools(WEATHER), "auto", None)
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'}]
    assert not renders_tools(CHATML)
    text = ChatTemplate(CHATML).render(prompt_messages(messages, use, by_template=False))
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe brief.\n\n") and json.dumps(WEATHER) in system
    assert "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}" \
           "\n</tool_call><|im_end|>" in text
    assert "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>" in text


def test_a_template_that_renders_tools_gets_them_and_arguments_as_objects() -> None:
    template = ("{% for t in tools %}[{{ t.function.name }}]{% endfor %}{% for m in messages %}"
                "{% for c in m.tool_calls or [] %}{{ c.function.name }}:{{ c.function.arguments.city }}{% endfor %}"
                "{% endfor %}")
    assert renders_tools(template)
    use, _ = check_tools(_tools(WEATHER), "auto", None)
    messages = prompt_messages([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}],
        use, by_template=True)
    assert ChatTemplate(template).render(messages, tools=use.tools) == "[get_weather]get_weather:Oslo"


def test_forced_choices_compile_to_grammars_and_free_ones_do_not() -> None:
    assert check_tools(_tools(WEATHER), "auto", None)[1] == ""
    assert check_tools(_tools(WEATHER), "none", None)[0].read_calls is False
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        assert "get_weather" in check_tools(_tools(WEATHER), choice, None)[1]
    assert check_tools(None, None, None) == (None, "")


@pytest.mark.parametrize("tools, choice, param", [
    ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice.function.name"),
    ([WEATHER], "sometimes", "tool_choice"),
    ([], "required", "tool_choice"),
    ([{**WEATHER, "type": "retrieval"}], "auto", "tools[0].type"),
    ([{"type": "function", "function": {"name": "has space"}}], "auto", "tools[0].function.name"),
    ([WEATHER, WEATHER], "auto", "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}], "auto",
     "tools[0].function.parameters"),
])
def test_malformed_tools_and_choices_are_400s_naming_the_field(tools, choice, param) -> None:
    with pytest.raises(ApiError) as err:
        check_tools(_tools(*tools), choice, None)
    assert err.value.status == 400 and err.value.param == param


@pytest.mark.parametrize("fmt, param", [
    ({"type": "xml"}, "response_format.type"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}},
     "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "x": "y" * 70000}}},
     "response_format.json_schema.schema"),
])
def test_malformed_response_formats_are_400s_naming_the_field(fmt, param) -> None:
    with pytest.raises(ApiError) as err:
        response_grammar(convert_body(fmt, ResponseFormat))
    assert err.value.status == 400 and err.value.param == param


def test_json_formats_compile() -> None:
    assert response_grammar(None) == response_grammar(convert_body({"type": "text"}, ResponseFormat)) == ""
    assert "json_schema" in response_grammar(convert_body({"type": "json_object"}, ResponseFormat))
