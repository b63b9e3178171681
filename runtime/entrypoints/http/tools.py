"""Chat's `tools`, `tool_choice` and `response_format`: what the prompt says, what decoding must follow,
and the tool calls read back out of the answer.

* **The prompt.** A chat template that renders tools itself (it names `tools`, as Qwen's, Llama 3's and
  SmolLM3's do) gets them as transformers passes them (`tools=`, earlier calls' arguments as objects). A
  template that does not (SmolLM2's) is given them the Hermes way, which many open models were tuned on:
  a system message listing the functions in `<tools>` and asking for `<tool_call>` blocks, earlier calls
  written back as those blocks and tool results as `<tool_response>` user turns. Which one a model gets
  is shown on /v1/models (`tool_prompt`), never chosen quietly.
* **The answer.** A call is a block `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` in the
  answer's text (the Hermes format, which the Qwen family writes too). `tool_choice: "required"` or a
  named function compiles the calls into a grammar (sampling/grammar.py), so the answer is always valid
  calls of declared functions with arguments that fit their schemas (one call, or one or more a line apart
  when `parallel_tool_calls` is true: OpenAI's default is true, but a small model then calls again and
  again until `max_tokens` cuts it); `auto` leaves decoding free and
  reads whatever well-formed calls of declared functions the answer holds; `none` reads none.
  `response_format` (`json_object`, `json_schema`) compiles its schema the same way.
* **Out.** The answer's calls become OpenAI's `tool_calls` (`finish_reason: "tool_calls"`); its other text
  stays `content` (null when there is none). Streamed, text is sent as it comes, but text that may begin a
  call is held until the call closes, then sent as one `tool_calls` delta (`ToolCallStream`).
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Iterable

import jsonschema
import llguidance
import msgspec

from runtime.entrypoints.http.context import ServerContext
from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.limits import ServeLimits
from runtime.entrypoints.http.schemas import ResponseFormat, ToolDef
from runtime.model_executor.sampling import GrammarError, check_grammar
from runtime.transport.request_params import RequestParams

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")   # OpenAI's rule for function names
OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.S)
# constrained JSON is written on one line, `json.dumps`' spacing: free whitespace would let a model spend its
# tokens on blank lines (a schema's own "x-guidance" options win)
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

TOOL_SYSTEM = ("You may call one or more functions to assist with the user query. The functions are given as "
               "JSON schemas inside <tools></tools>:\n<tools>\n{tools}\n</tools>\nTo call a function, answer with "
               "a JSON object holding its name and arguments inside <tool_call></tool_call>:\n"
               "<tool_call>\n{{\"name\": <function-name>, \"arguments\": <arguments-object>}}\n</tool_call>")


@dataclass
class ToolUse:
    """What a chat request's tools ask of the prompt and of the answer."""

    tools: list[dict[str, Any]]        # the functions as OpenAI sends them (to the prompt)
    names: frozenset[str]              # declared function names: only their calls are read
    read_calls: bool                   # the answer is read for calls (every choice but "none")


def check_tools(tools: list[ToolDef] | None, tool_choice: Any, parallel: bool | None,
                limits: ServeLimits = ServeLimits()) -> tuple[ToolUse | None, str]:
    """The request's tool use and the grammar its `tool_choice` forces ("" when decoding is free); ApiError
    (400) naming the field when a tool or the choice is malformed or past the graph's `limits`."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise ApiError(400, "tool_choice needs 'tools'", "tool_choice")
        return None, ""
    if len(tools) > limits.max_tools:
        raise ApiError(400, f"at most {limits.max_tools} tools (param max_tools), got {len(tools)}", "tools")
    names: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        field = f"tools[{i}]"
        if tool.type != "function":
            raise ApiError(400, f"{field}.type: only 'function' tools are served, got {tool.type!r}", f"{field}.type")
        if not _NAME.fullmatch(tool.function.name):
            raise ApiError(400, f"{field}.function.name must be 1-64 letters, digits, '_' or '-', "
                           f"got {tool.function.name!r}", f"{field}.function.name")
        if tool.function.name in names:
            raise ApiError(400, f"{field}.function.name: '{tool.function.name}' is declared twice",
                           f"{field}.function.name")
        names[tool.function.name] = _checked_schema(tool.function.parameters or {"type": "object"},
                                                    f"{field}.function.parameters", limits)
    forced = _forced(tool_choice, names)
    use = ToolUse([msgspec.to_builtins(t) for t in tools], frozenset(names), tool_choice != "none")
    if not forced:
        return use, ""
    one = not parallel or isinstance(tool_choice, dict)   # several calls only when asked: parallel_tool_calls true
    return use, _grammar(_calls_lark({n: names[n] for n in forced}, one), "tool_choice")


def _forced(tool_choice: Any, names: dict[str, Any]) -> list[str]:
    """The functions a call is forced among ([] when the answer is free)."""
    if tool_choice is None or tool_choice in ("auto", "none"):
        return []
    if tool_choice == "required":
        return list(names)
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function" \
            and isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
        if name not in names:
            raise ApiError(400, f"tool_choice names function {name!r}, which 'tools' does not declare",
                           "tool_choice.function.name")
        return [name]
    raise ApiError(400, "tool_choice must be 'none', 'auto', 'required' or "
                   "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")


def _calls_lark(functions: dict[str, dict[str, Any]], one: bool) -> str:
    """A Lark grammar (llguidance's dialect, `%json` for a schema) of one call, or of calls one per line."""
    call = {"x-guidance": JSON_LAYOUT,
            "anyOf": [{"type": "object", "properties": {"name": {"const": name}, "arguments": schema},
                       "required": ["name", "arguments"], "additionalProperties": False}
                      for name, schema in functions.items()]}
    body = json.dumps(call, ensure_ascii=False)
    start = "start: call" if one else 'start: call ("\\n" call)*'
    return f'{start}\ncall: "{OPEN}\\n" body "\\n{CLOSE}"\nbody: %json {body}\n'


def response_grammar(response_format: ResponseFormat | None, limits: ServeLimits = ServeLimits()) -> str:
    """The grammar `response_format` asks for ("" for text or none); ApiError(400) naming the field."""
    if response_format is None or response_format.type == "text":
        return ""
    if response_format.type == "json_object":
        return _grammar({"type": "object"}, "response_format")
    if response_format.type != "json_schema":
        raise ApiError(400, "response_format.type must be 'text', 'json_object' or 'json_schema', "
                       f"got {response_format.type!r}", "response_format.type")
    fmt = response_format.json_schema
    if fmt is None or fmt.schema is None:
        raise ApiError(400, "response_format.json_schema.schema is required", "response_format.json_schema.schema")
    field = "response_format.json_schema.schema"
    return _grammar(_checked_schema(fmt.schema, field, limits), field)


def with_grammar(server: ServerContext, params: RequestParams, grammar: str, field: str) -> RequestParams:
    """`params` with the chat LM's answer held to `grammar` ("": unchanged); a 400 naming `field` when that LM
    cannot sample under a grammar (the workers say which nodes can)."""
    if not grammar:
        return params
    if not server.constrains_output():
        raise ApiError(400, f"the model '{server.model_id}' cannot constrain its output: its chat LM does not "
                       "sample under a grammar", field)
    return msgspec.structs.replace(params, grammars={server.chat_node: grammar})


def _checked_schema(schema: Any, field: str, limits: ServeLimits) -> dict[str, Any]:
    if not isinstance(schema, dict):
        raise ApiError(400, f"{field} must be a JSON Schema object", field)
    if len(json.dumps(schema)) > limits.max_schema_bytes:
        raise ApiError(400, f"{field} is larger than {limits.max_schema_bytes} bytes as JSON (param max_schema_bytes)",
                       field)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ApiError(400, f"{field} is not a valid JSON Schema: {exc.message}", field) from None
    return schema


def _grammar(source: dict[str, Any] | str, field: str) -> str:
    """An llguidance grammar from a JSON Schema (dict) or a Lark grammar (str), checked by the engine."""
    grammar = llguidance.LLMatcher.grammar_from_lark(source) if isinstance(source, str) \
        else llguidance.LLMatcher.grammar_from_json_schema(source, defaults=JSON_LAYOUT)
    try:
        check_grammar(grammar)
    except GrammarError as exc:
        raise ApiError(400, f"{field}: the schema cannot be compiled for constrained decoding: {exc}", field) from None
    return grammar


# ---- the prompt ----------------------------------------------------------------------

def renders_tools(template_source: str | None) -> bool:
    """Whether a chat template renders `tools` itself (else tools go in the Hermes system message)."""
    return bool(template_source) and re.search(r"\btools\b", template_source) is not None


def prompt_messages(messages: list[dict[str, Any]], use: ToolUse, by_template: bool) -> list[dict[str, Any]]:
    """`messages` as the chat template takes them with tools: calls' arguments as objects for a template
    that renders tools; for one that does not, the Hermes system message, calls and results as text."""
    if by_template:
        return [_arguments_as_objects(m) for m in messages]
    system = tool_system_prompt(use)
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            blocks = "\n".join(call_block(*_name_and_arguments(c)) for c in m["tool_calls"])
            out.append({"role": "assistant", "content": f"{m.get('content') or ''}{blocks}"})
        elif m["role"] == "tool":
            out.append({"role": "user", "content": tool_response(m.get("content") or "")})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    if out and out[0]["role"] in ("system", "developer"):
        out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{system}"}
    else:
        out.insert(0, {"role": "system", "content": system})
    return out


def tool_system_prompt(use: ToolUse) -> str:
    """The Hermes system text listing the functions (for a template that does not render tools)."""
    return TOOL_SYSTEM.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in use.tools))


def call_block(name: Any, arguments: Any) -> str:
    """A call as the Hermes prompt writes it (arguments given as JSON text are written as the object)."""
    call = {"name": name, "arguments": _arguments(arguments)}
    return f"{OPEN}\n{json.dumps(call, ensure_ascii=False)}\n{CLOSE}"


def tool_response(output: str) -> str:
    """A function's output as the Hermes prompt writes it (a user turn's text)."""
    return f"<tool_response>\n{output}\n</tool_response>"


def _name_and_arguments(call: Any) -> tuple[Any, Any]:
    function = call.get("function", {}) if isinstance(call, dict) else {}
    return function.get("name"), function.get("arguments")


def _arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _arguments_as_objects(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return message
    fixed = [{**c, "function": {**function, "arguments": _arguments(function.get("arguments"))}}
             for c in calls if isinstance(c, dict) for function in [c.get("function", {})]]
    return {**message, "tool_calls": fixed}


# ---- the answer ----------------------------------------------------------------------

def read_call(text: str, names: frozenset[str]) -> dict[str, Any] | None:
    """An OpenAI tool call from one block's JSON, None when it is not a call of a declared function."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", {})
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": value["name"],
                         "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments,
                                                                                               ensure_ascii=False)}}


def split_calls(text: str, names: frozenset[str]) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool calls) of a whole answer: blocks that are calls leave the text, others stay in it."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    at = 0
    for match in _BLOCK.finditer(text):
        call = read_call(match.group(1), names)
        if call is None:
            continue
        kept.append(text[at:match.start()])
        calls.append(call)
        at = match.end()
    kept.append(text[at:])
    content = "".join(kept).strip() if calls else "".join(kept)
    return content or None, calls


class ToolCallStream:
    """Streamed text split into content deltas and completed calls (see the module docstring)."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.held = ""            # text that is, or may begin, a call
        self.calls = 0

    def push(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """(content to send now, calls completed by this text)."""
        self.held += text
        content, calls = "", []
        while self.held:
            start = self.held.find(OPEN)
            if start < 0:
                keep = _prefix_overlap(self.held, OPEN)
                content += self.held[:len(self.held) - keep]
                self.held = self.held[len(self.held) - keep:]
                break
            end = self.held.find(CLOSE, start)
            if end < 0:
                content += self.held[:start]
                self.held = self.held[start:]
                break
            block = self.held[start:end + len(CLOSE)]
            call = read_call(block[len(OPEN):-len(CLOSE)].strip(), self.names)
            content += self.held[:start] + (block if call is None else "")
            calls += [] if call is None else [call]
            self.held = self.held[end + len(CLOSE):]
        self.calls += len(calls)
        if self.calls and not content.strip():    # the line breaks between and after calls are not content
            content = ""
        return content, calls

    def finish(self) -> str:
        """What is still held (an unclosed block) as content."""
        held, self.held = self.held, ""
        return held


def _prefix_overlap(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def tool_call_deltas(calls: Iterable[dict[str, Any]], first_index: int) -> list[dict[str, Any]]:
    """Calls as streamed `tool_calls` delta entries (each whole, with its index among the answer's calls)."""
    return [{"index": first_index + i, **call} for i, call in enumerate(calls)]
