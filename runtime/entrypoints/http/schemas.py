"""The JSON bodies of the HTTP endpoints: one msgspec Struct per endpoint, parsed once at the edge.

A handler reads its body typed (`ServerContext.read_body(request, ChatCompletionBody)`) and past
that trusts the types; what only the plan can say (the model's name, param bounds, roles, media)
is checked by the handler. A body that does not fit its schema is a 400 in OpenAI's error body
whose `param` names the field: `messages[2].content`, `stop`, `audio.voice`. A schema's
`FIELD_ERRORS` gives the message (a format string of `field`) for a path and everything under
it, naming that path ("messages[]": any element); other fields get a message made from msgspec's (`'seed' must be an
integer, got a string`). JSON itself is strict: NaN and Infinity are not numbers (400).
"""
from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import msgspec

from runtime.entrypoints.http.errors import ApiError

Body = TypeVar("Body", bound=msgspec.Struct)


class ChatMessage(msgspec.Struct):
    role: str                            # checked against the chat roles by the handler
    content: str | list[Any] | None = None   # text, or content parts (text, image_url, input_audio, ...);
                                             # null only in an assistant turn that called tools
    tool_calls: list[dict[str, Any]] | None = None   # an assistant turn's calls, as the API returned them
    tool_call_id: str | None = None      # a `tool` turn: the call it answers
    name: str | None = None


class FunctionDef(msgspec.Struct, omit_defaults=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None     # a JSON Schema of the arguments object
    strict: bool | None = None                   # always strict here when the call is forced


class ToolDef(msgspec.Struct, omit_defaults=True):
    type: str
    function: FunctionDef


class JsonSchemaFormat(msgspec.Struct):
    name: str = "response"
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(msgspec.Struct):
    type: str                                    # "text" | "json_object" | "json_schema"
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = None    # a last chunk with `usage` before [DONE]


class AudioOutput(msgspec.Struct):
    voice: str = "alloy"                 # the model's voice or one of OpenAI's names
    format: str | msgspec.UnsetType = msgspec.UNSET    # "wav" | "pcm16"; unset: pcm16 when streamed, else wav


class SamplingFields(msgspec.Struct, kw_only=True):
    """The sampling fields chat and completions bodies share (vLLM's extensions `top_k`, `min_p`,
    `repetition_penalty`, `stop_token_ids`, `ignore_eos` among them)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    stop: str | list[str] | None = None          # stop strings, cut from the answer
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None               # forced lengths (benchmarks)


class ChatCompletionBody(SamplingFields):
    """POST /v1/chat/completions (OpenAI's chat; vLLM's extensions `top_k`, `min_p`,
    `repetition_penalty`, `stop_token_ids`, `ignore_eos`; `max_audio_frames` for an audio answer)."""

    FIELD_ERRORS: ClassVar[dict[str, str]] = {
        "model": "'model' must be a string",
        "messages": "'messages' must be a non-empty array",
        "messages[]": "{field} must be an object with a string 'role' and 'content'",
        "n": "'n' must be an integer: how many answers (1-16)",
        "stream": "'stream' must be a boolean",
        "stop": "'stop' must be a string or an array of strings",
        "stop_token_ids": "'stop_token_ids' must be an array of token ids",
        "audio": "'audio' must be an object {{voice, format}}",
        "audio.voice": "'audio.voice' must be a string",
        "audio.format": "audio.format must be 'wav' or 'pcm16' ('pcm16' when streaming)",
    }

    model: str
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    n: int = 1                                   # answers to the prompt (chat.py's Samples), at most 16
    stream: bool = False                         # SSE chunks as the answer decodes
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None                # None: the graph's default
    max_completion_tokens: int | None = None     # OpenAI's newer name for max_tokens (taken when given)
    logprobs: bool | None = None
    top_logprobs: int | None = None              # 0..20 alternatives per token, with logprobs
    modalities: list[str] | None = None          # ["text", "audio"]: answered in speech too (audio_chat.py)
    audio: AudioOutput | None = None
    max_audio_frames: int | None = None          # a speaking plan's param (Qwen3-Omni)
    tools: list[ToolDef] | None = None           # functions the model may call (tools.py)
    tool_choice: str | dict[str, Any] | None = None   # "none" | "auto" | "required" | {"type": "function", ...}
    parallel_tool_calls: bool | None = None      # true: a forced answer may hold several calls
    response_format: ResponseFormat | None = None    # {"type": "json_object"} / {"type": "json_schema", ...}


class CompletionBody(SamplingFields):
    """POST /v1/completions (OpenAI's completions: a raw prompt, no chat template; vLLM's extensions as on
    chat). One prompt per request: a string or its token ids (an array holding one of them is taken too)."""

    FIELD_ERRORS: ClassVar[dict[str, str]] = {
        "model": "'model' must be a string",
        "prompt": "'prompt' must be a string or an array of token ids",
        "stream": "'stream' must be a boolean",
        "stop": "'stop' must be a string or an array of strings",
        "stop_token_ids": "'stop_token_ids' must be an array of token ids",
        "logprobs": "'logprobs' must be an integer: how many alternatives to give per token (0-20)",
    }

    model: str
    prompt: str | list[Any]                      # a string, token ids, or a one-element array of either
    max_tokens: int | None = 16                  # OpenAI's default for completions
    n: int = 1                                   # answers to the prompt (chat.py's Samples), at most 16
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = False                           # the prompt before the answer: not supported
    suffix: str | None = None                    # text after the insertion: not supported
    best_of: int | None = None                   # only 1
    logprobs: int | None = None                  # alternatives per token (0: the chosen token's alone)
    user: str | None = None                      # OpenAI's end-user id: not used
    response_format: ResponseFormat | None = None    # vLLM's extension: the answer held to JSON (tools.py)


class SpeechBody(msgspec.Struct):
    """POST /v1/audio/speech (OpenAI's text-to-speech; extensions: the sampling fields,
    `max_tokens`, `max_audio_frames`)."""

    FIELD_ERRORS: ClassVar[dict[str, str]] = {
        "model": "'model' must be a string",
        "input": "'input' must be a non-empty string",
        "speed": "only speed 1.0 is supported",
    }

    model: str
    input: str = ""                          # the text to speak; checked non-empty by the handler
    voice: str = "alloy"
    response_format: str = "wav"             # "wav" | "pcm"
    stream_format: str | None = None         # "audio": the file's bytes as produced, "sse": delta events
    stream: bool | None = None               # true: stream_format "audio" unless one is given
    speed: float = 1.0                       # only 1.0
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_audio_frames: int | None = None


class TranscriptionForm(msgspec.Struct):
    """POST /v1/audio/transcriptions: the multipart form's text fields (the `file` part is the audio;
    a field not named here is refused as the form is read). Form values are strings: numbers and
    booleans are read from them (`parse_form`)."""

    FIELD_ERRORS: ClassVar[dict[str, str]] = {
        "model": "'model' must be a string",
        "response_format": "response_format must be one of ('json', 'text', 'verbose_json', 'srt', 'vtt')",
        "temperature": "temperature must be a number",
        "stream": "stream must be 'true' or 'false'",
    }

    model: str
    language: str | None = None              # the audio's language, for the model's prompt
    prompt: str | None = None                # text the transcription continues
    response_format: Literal["json", "text", "verbose_json", "srt", "vtt"] = "json"   # srt, vtt: timed models only
    temperature: float = 0.0                 # 0: greedy
    stream: bool = False                     # SSE transcript.text.delta events


class TranslationForm(msgspec.Struct):
    """POST /v1/audio/translations: OpenAI's form (the audio's speech as English text); no language, no stream."""

    FIELD_ERRORS: ClassVar[dict[str, str]] = TranscriptionForm.FIELD_ERRORS

    model: str
    prompt: str | None = None                # English text the translation continues
    response_format: Literal["json", "text", "verbose_json", "srt", "vtt"] = "json"
    temperature: float = 0.0


class RealtimeEvent(msgspec.Struct):
    """A /v1/realtime client event this server takes no fields of (input_audio_buffer.commit and
    .clear, response.create, response.cancel): its type and the client's id for it."""

    FIELD_ERRORS: ClassVar[dict[str, str]] = {}

    type: str = ""
    event_id: Any = None                     # echoed in an `error` event about this one


class RealtimeFunction(msgspec.Struct, omit_defaults=True):
    """A realtime session's function tool (the Realtime API's flat shape, not chat's nested one)."""

    name: str
    type: str = "function"
    description: str | None = None
    parameters: dict[str, Any] | None = None


class TurnDetection(msgspec.Struct, forbid_unknown_fields=True):
    """session.update's `turn_detection` (OpenAI's fields and defaults): the server hears when the user
    speaks and stops (runtime/entrypoints/http/realtime_turns.py)."""

    type: str
    threshold: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.5
    prefix_padding_ms: Annotated[int, msgspec.Meta(ge=0, le=10000)] = 300
    silence_duration_ms: Annotated[int, msgspec.Meta(ge=1, le=10000)] = 500
    create_response: bool = True           # answer each turn when it ends
    interrupt_response: bool = True        # speech cancels the response playing (barge-in)


class RealtimeSessionConfig(msgspec.Struct):
    """session.update's `session`: the settings this server reads (unset: unchanged; any other field
    is not taken)."""

    instructions: str | msgspec.UnsetType = msgspec.UNSET
    voice: str | msgspec.UnsetType = msgspec.UNSET
    modalities: list[str] | msgspec.UnsetType = msgspec.UNSET
    input_audio_format: str | msgspec.UnsetType = msgspec.UNSET
    output_audio_format: str | msgspec.UnsetType = msgspec.UNSET
    turn_detection: TurnDetection | None | msgspec.UnsetType = msgspec.UNSET     # null: the client commits
    temperature: float | None | msgspec.UnsetType = msgspec.UNSET
    max_response_output_tokens: Annotated[int, msgspec.Meta(ge=1)] | Literal["inf"] | msgspec.UnsetType = \
        msgspec.UNSET
    tools: list[RealtimeFunction] | msgspec.UnsetType = msgspec.UNSET
    tool_choice: str | dict[str, Any] | msgspec.UnsetType = msgspec.UNSET   # "auto" | "none" | "required" | a name


class SessionUpdateEvent(RealtimeEvent):
    FIELD_ERRORS: ClassVar[dict[str, str]] = {
        "session": "session.update needs a 'session' object",
        "session.instructions": "session.instructions must be a string",
        "session.voice": "session.voice must be a string",
        "session.modalities": 'session.modalities must be ["text"] or ["audio", "text"]',
        "session.temperature": "session.temperature must be a number",
        "session.max_response_output_tokens": "session.max_response_output_tokens must be a positive integer or 'inf'",
        "session.tools": "session.tools must be an array of {{type: 'function', name, description, parameters}}",
        "session.tool_choice": "session.tool_choice must be 'auto', 'none', 'required' or {{type: 'function', name}}",
        "session.turn_detection": "session.turn_detection must be null or {{type: 'server_vad', threshold, "
                                  "prefix_padding_ms, silence_duration_ms, create_response, interrupt_response}} "
                                  "and no other field",
        "session.turn_detection.type": "session.turn_detection.type must be a string ('server_vad')",
        "session.turn_detection.threshold": "session.turn_detection.threshold must be a number from 0 to 1",
        "session.turn_detection.prefix_padding_ms": "session.turn_detection.prefix_padding_ms must be an integer "
                                                    "from 0 to 10000",
        "session.turn_detection.silence_duration_ms": "session.turn_detection.silence_duration_ms must be an "
                                                      "integer from 1 to 10000",
        "session.turn_detection.create_response": "session.turn_detection.create_response must be a boolean",
        "session.turn_detection.interrupt_response": "session.turn_detection.interrupt_response must be a boolean",
    }

    session: RealtimeSessionConfig | msgspec.UnsetType = msgspec.UNSET


class AudioAppendEvent(RealtimeEvent):
    FIELD_ERRORS: ClassVar[dict[str, str]] = {"audio": "'audio' must be base64 pcm16"}

    audio: str = ""                          # base64 pcm16, 24 kHz mono


class SpeechStreamSettings(msgspec.Struct, forbid_unknown_fields=True):
    """/v1/audio/speech/stream's `session.update` settings (unset: unchanged); clauses released after
    the update take them."""

    voice: str | msgspec.UnsetType = msgspec.UNSET
    seed: int | None | msgspec.UnsetType = msgspec.UNSET           # clause i samples with seed + i
    temperature: float | None | msgspec.UnsetType = msgspec.UNSET
    top_p: float | None | msgspec.UnsetType = msgspec.UNSET
    max_tokens: int | None | msgspec.UnsetType = msgspec.UNSET     # per clause
    max_audio_frames: int | None | msgspec.UnsetType = msgspec.UNSET


class SpeechStreamUpdateEvent(RealtimeEvent):
    FIELD_ERRORS: ClassVar[dict[str, str]] = {
        "session": "session.update needs a 'session' object of voice, seed, temperature, top_p, max_tokens, "
                   "max_audio_frames and no other field",
    }

    session: SpeechStreamSettings | msgspec.UnsetType = msgspec.UNSET


class TextAppendEvent(RealtimeEvent):
    FIELD_ERRORS: ClassVar[dict[str, str]] = {"delta": "'delta' must be a string"}

    delta: str = ""


class ItemCreateEvent(RealtimeEvent):
    FIELD_ERRORS: ClassVar[dict[str, str]] = {"previous_item_id": "'previous_item_id' must be a string"}

    previous_item_id: str | None = None      # after this item (null: at the end, "root": first)
    item: Any = None                         # checked by realtime_conversation.client_item


class ItemDeleteEvent(RealtimeEvent):
    FIELD_ERRORS: ClassVar[dict[str, str]] = {"item_id": "'item_id' must be a string"}

    item_id: str = ""


class ItemTruncateEvent(RealtimeEvent):
    FIELD_ERRORS: ClassVar[dict[str, str]] = {
        "item_id": "'item_id' must be a string", "content_index": "'content_index' must be an integer",
        "audio_end_ms": "'audio_end_ms' must be an integer (milliseconds)"}

    item_id: str = ""
    content_index: int = 0
    audio_end_ms: int = 0


class TextInput(msgspec.Struct, tag_field="type", tag="text"):
    text: str                                # tokenised by the served LM's tokenizer


class TokensInput(msgspec.Struct, tag_field="type", tag="tokens"):
    ids: list[Annotated[int, msgspec.Meta(ge=0)]]


class TaskBody(msgspec.Struct):
    """POST /v1/tasks/{task}: the task's params (checked against the plan) and its prompt inputs."""

    FIELD_ERRORS: ClassVar[dict[str, str]] = {
        "": "the body must be an object with an optional 'params' object",
        "inputs": "'inputs' must be an array",
        "inputs[]": "{field} must be {{'type': 'text', 'text': str}} or {{'type': 'tokens', 'ids': [int]}}",
    }

    params: dict[str, Any] = {}
    inputs: list[TextInput | TokensInput] = []


def parse_body(raw: bytes, schema: type[Body]) -> Body:
    """`raw` JSON decoded into `schema`; ApiError(400) naming the field when it does not fit."""
    try:
        return msgspec.json.decode(raw, type=schema)
    except msgspec.ValidationError as exc:
        raise field_error(str(exc), getattr(schema, "FIELD_ERRORS", {})) from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"the body is not valid JSON ({exc})") from None


def parse_form(fields: dict[str, str], schema: type[Body]) -> Body:
    """A form's string `fields` read into `schema` (numbers and booleans from their text); ApiError(400)
    naming the field when one does not fit."""
    return convert_body(fields, schema, strict=False)


def convert_body(value: Any, schema: type[Body], strict: bool = True) -> Body:
    """`value`, decoded already (a realtime event's JSON, a form's fields), read into `schema`;
    ApiError(400) naming the field when it does not fit."""
    try:
        return msgspec.convert(value, schema, strict=strict)
    except msgspec.ValidationError as exc:
        raise field_error(str(exc), getattr(schema, "FIELD_ERRORS", {})) from None


_AT = re.compile(r"(?P<detail>.*?)(?: - at `\$(?P<path>.*)`)?", re.S)
_MISSING = re.compile(r"Object missing required field `(?P<name>[^`]*)`")
_EXPECTED = re.compile(r"Expected `(?P<want>[^`]*)`, got `(?P<got>[^`]*)`")
_NON_EMPTY = re.compile(r"Expected `array` of length >= 1")
_STEP = re.compile(r"\[[^\]]*\]|[^.\[]+")
_KINDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean", "array": "an array",
          "object": "an object", "null": "null"}


def field_error(error: str, messages: dict[str, str]) -> ApiError:
    """The 400 of a msgspec validation error ("Expected `bool`, got `str` - at `$.stream`")."""
    match = _AT.fullmatch(error)
    detail, path = match["detail"], (match["path"] or "").lstrip(".")
    if missing := _MISSING.fullmatch(detail):
        path = f"{path}.{missing['name']}" if path else missing["name"]
    steps = _STEP.findall(path)
    if "[...]" in steps:                  # a value in a map, whose key msgspec does not say: the map is named
        steps = steps[:steps.index("[...]")]
        path = _join(steps)
    for n in range(len(steps), 0, -1):    # the deepest part of the path with a message of its own
        shape = _join(re.sub(r"^\[.*\]$", "[]", step) for step in steps[:n])
        if shape in messages:
            field = _join(steps[:n])
            return ApiError(400, messages[shape].format(field=field), field)
    if not path:                          # the body itself
        return ApiError(400, messages.get("", "the request body must be a JSON object"))
    return ApiError(400, _said(path, detail), path)


def _join(steps: Any) -> str:
    return "".join(s if s.startswith("[") or i == 0 else f".{s}" for i, s in enumerate(steps))


def _said(field: str, detail: str) -> str:
    """msgspec's complaint about `field` said for people."""
    if _MISSING.fullmatch(detail):
        return f"'{field}' is required"
    if _NON_EMPTY.fullmatch(detail):
        return f"'{field}' must be a non-empty array"
    if expected := _EXPECTED.fullmatch(detail):
        want = [_KINDS.get(k, k) for k in expected["want"].split(" | ") if k != "null"]
        return f"'{field}' must be {' or '.join(want)}, got {_KINDS.get(expected['got'], expected['got'])}"
    return f"'{field}': {detail[:1].lower()}{detail[1:]}"
