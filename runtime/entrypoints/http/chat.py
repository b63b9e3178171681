"""POST /v1/chat/completions: OpenAI chat over the plan's chat task (text in, text out).

The prompt is the checkpoint's chat template applied to `messages`; output text is
decoded incrementally (never splitting a character), stop strings are cut, and `usage`
and `finish_reason` are real. `n` answers share the prompt's prefill (`Samples`). A client that goes
away aborts the request, which frees its KV blocks at once.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

import msgspec
from aiohttp import web

from runtime.conductor.config import QueueFull
from runtime.conductor.request import OutputEvent, Request
from runtime.model_executor.sampling import SamplingParams
from runtime.entrypoints.http.context import ServerContext
from runtime.entrypoints.http.errors import ApiError, event_error
from runtime.entrypoints.http.limits import (
    ServeLimits, check_context, check_roles, check_top_k, max_context, vocab_size,
)
from runtime.entrypoints.http.logprobs import LogprobsContent, missing_logprobs, requested_logprobs
from runtime.entrypoints.http.multimodal import IMAGE_TASK, has_image_parts, image_chat_items
from runtime.entrypoints.http.params import openai_field, resolve_params
from runtime.entrypoints.http.schemas import ChatCompletionBody
from runtime.entrypoints.http.sse import SSE_DONE, sse_data, sse_error, sse_response
from runtime.entrypoints.http.tools import (
    ToolCallStream, ToolUse, check_tools, prompt_messages, response_grammar, split_calls, tool_call_deltas,
    with_grammar)
from runtime.text import TextOutput
from runtime.transport.request_params import RequestParams

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
                 "repetition_penalty")


@dataclass
class ChatRequest:
    """A parsed, checked chat request."""

    prompt_ids: list[int]
    params: RequestParams
    stop: tuple[str, ...]
    is_sse: bool                                      # answered as SSE events (the body's `stream`)
    include_usage: bool
    task: str | None = None                           # None: the plan's chat task
    input_items: list[tuple[str, Any]] | None = None  # interleaved text/media items (a chat with images, audio)
    tools: ToolUse | None = None                      # the request's tools (the answer is read for calls)


def parse_chat(body: ChatCompletionBody, server: ServerContext) -> ChatRequest:
    """Check the typed body against the plan (its model, roles, media parts, params, tools); ApiError(4xx) if wrong."""
    server.check_model(body.model)
    if server.chat_node is None and server.chat_inputs is None:
        raise ApiError(400, f"the model '{server.model_id}' has no chat task")
    messages = chat_messages(body)
    check_roles(messages)
    tools, grammar, field = _constraints(body, server.limits)
    media_items = server.chat_inputs.chat_items(messages, server.tokenizer) if server.chat_inputs else None
    image_items = None if media_items else image_chat_items(messages, server.plan, server.tokenizer)
    if tools is not None and (media_items is not None or image_items is not None):
        raise ApiError(400, "'tools' are served with text messages only", "tools")
    if image_items is None and media_items is None:
        messages = [{**m, "content": _text_content(m["content"], i)} for i, m in enumerate(messages)]
    check_n(body.n)
    # a media prompt's shape (its pieces, its pictures' grids) is set by the family's reader, not the body
    family = server.chat_inputs.request_params(media_items) if media_items is not None else None
    params = resolve_params(server.plan, given_fields(body), family)
    params = with_grammar(server, params, grammar, field)
    sampling = params.sampling
    check_top_k(sampling.effective_top_k or None, vocab_size(server.plan, server.chat_node))
    is_sse, include_usage = body.stream, bool(body.stream_options and body.stream_options.include_usage)
    if media_items is not None:
        return ChatRequest(item_tokens(media_items), params, sampling.stop, is_sse, include_usage, None, media_items)
    if image_items is not None:
        prompt_ids = [t for dtype, ids in image_items if dtype == "text" for t in ids]
        return ChatRequest(prompt_ids, params, sampling.stop, is_sse, include_usage, IMAGE_TASK, image_items)
    return ChatRequest(chat_prompt(server, messages, tools), params, sampling.stop, is_sse, include_usage,
                       tools=tools)


def _constraints(body: ChatCompletionBody, limits: ServeLimits) -> tuple[ToolUse | None, str, str]:
    """The request's tool use, the grammar its output must follow ("": none) and the field that asks for it,
    checked (tools.py)."""
    tools, tool_grammar = check_tools(body.tools, body.tool_choice, body.parallel_tool_calls, limits)
    format_grammar = response_grammar(body.response_format, limits)
    if tool_grammar and format_grammar:
        raise ApiError(400, "response_format cannot apply when tool_choice forces a call", "response_format")
    return tools, tool_grammar or format_grammar, "tool_choice" if tool_grammar else "response_format"


def chat_messages(body: ChatCompletionBody) -> list[dict[str, Any]]:
    """The messages as chat templates and a family's chat-input reader take them: {role, content}, and an
    assistant turn's `tool_calls`, a tool turn's `tool_call_id` and `name` where given."""
    messages = []
    for i, m in enumerate(body.messages):
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            raise ApiError(400, f"messages[{i}].content is required (null only in an assistant turn that called "
                           "tools)", f"messages[{i}].content")
        extra = {"tool_calls": m.tool_calls, "tool_call_id": m.tool_call_id, "name": m.name}
        messages.append({"role": m.role, "content": m.content, **{k: v for k, v in extra.items() if v is not None}})
    return messages


def chat_prompt(server: ServerContext, messages: list[dict], tools: ToolUse | None = None) -> list[int]:
    """The prompt ids of text-only messages: the checkpoint's chat template, opening the assistant's turn
    (with the request's tools: the template's own way, or tools.py's system message)."""
    if server.chat_node is None:
        raise ApiError(400, f"the model '{server.model_id}' has no chat task")
    variables: dict[str, Any] = {}
    if tools is not None:
        by_template = server.tool_prompt == "template"
        messages = prompt_messages(messages, tools, by_template)
        variables = {"tools": tools.tools} if by_template else {}
    try:
        text = server.tokenizer.render_chat(messages, add_generation_prompt=True, **variables)
    except ValueError as exc:
        raise ApiError(400, f"messages: {exc}", "messages") from None
    return server.tokenizer.encode(text, add_special_tokens=False)


def submit_chat(server: ServerContext, chat: ChatRequest) -> Request:
    """Queue a parsed chat (after checking that prompt + max_tokens fit the chat LM's context)."""
    plan = server.plan
    if chat.params.max_tokens is not None:
        check_context(len(chat.prompt_ids), chat.params.max_tokens, max_context(plan, server.chat_node))
    task = chat.task or ("chat" if any(t.name == "chat" for t in plan.tasks) else plan.default_task)
    sampling = chat.params.sampling
    stop_ids = server.stop_token_ids(sampling.stop_token_ids, sampling.ignore_eos)
    items = chat.input_items or [("text", chat.prompt_ids)]
    return server.conductor.submit(task, chat.params, items, stop_ids, server.config.request_timeout_s)


def item_tokens(items: list[tuple[str, Any]]) -> list[int]:
    """Every token id the LM reads for these input items: text runs and media placeholders."""
    return [t for dtype, value in items for t in (value if dtype == "text" else value.tokens)]


def _text_content(content: str | list | None, i: int) -> str | None:
    if content is None or isinstance(content, str):
        return content
    parts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ApiError(400, f"messages[{i}].content: this model takes text parts only", f"messages[{i}].content")
        parts.append(part["text"])
    return "".join(parts)


def given_fields(body: ChatCompletionBody) -> dict[str, Any]:
    """The body's fields a chat request's params take (sampling fields, max_tokens, stops)."""
    fields = msgspec.structs.asdict(body)
    given = {k: fields[k] for k in SAMPLING_KEYS}
    given["max_tokens"] = openai_field(fields, "max_tokens")
    given["stop"] = body.stop or None
    given["stop_token_ids"] = body.stop_token_ids or None   # vLLM's extension
    given["ignore_eos"] = body.ignore_eos   # vLLM's extension: forced lengths for benchmarks
    given["logprobs"] = requested_logprobs(fields)
    return given


class ChatEvents:
    """Turns a chat request's output events into text deltas, watching stop strings."""

    def __init__(self, server: ServerContext, req: Request, stop: tuple[str, ...], prompt_ids: list[int]) -> None:
        self.server, self.req = server, req
        self.text = TextOutput(server.tokenizer, SamplingParams(stop=stop), prompt_ids, stop_ids=req.stop_token_ids)
        self.finish_reason: str | None = None
        asked = req.params.sampling.logprobs is not None
        self.logprobs = LogprobsContent(server.tokenizer) if asked else None

    async def next(self) -> tuple[str, bool]:
        """(text delta, whether this was the last event)."""
        event: OutputEvent = await self.req.events.get()
        if event.finish_reason == "error":
            raise event_error(event)
        text = ""
        self._check_logprobs(event)
        for i, token in enumerate(event.token_ids):
            if self.text.finished:      # tokens of a step already in flight when a stop string matched
                break
            delta = self.text.push(token)
            text += delta.text
            if self.logprobs is not None and not isinstance(delta.stop_reason, int):
                self.logprobs.add(token, event.logprobs[i])
            if delta.finished and isinstance(delta.stop_reason, str) and self.finish_reason is None:
                self.finish_reason = "stop"
                self.server.conductor.end_early(self.req, "stop")
        if event.finish_reason is not None:
            text += self.text.finish()
            self.finish_reason = self.finish_reason or event.finish_reason
        return text, event.finish_reason is not None

    def _check_logprobs(self, event: OutputEvent) -> None:
        why = missing_logprobs(event.token_ids, event.logprobs) if self.logprobs is not None else None
        if why is not None:    # the handler's `finally` aborts the request
            raise ApiError(400, f"this model cannot answer 'logprobs': {why}", "logprobs")

    def take_logprobs(self) -> dict[str, Any] | None:
        """The `logprobs` of the tokens since the last call (None when the request did not ask)."""
        return self.logprobs.take() if self.logprobs is not None else None


# ---- n answers to one prompt ---------------------------------------------------------

MAX_N = 16            # answers one request may ask for
_SEED_MOD = 2 ** 63   # answer seeds stay in torch's range


def check_n(n: int) -> None:
    if not 1 <= n <= MAX_N:
        raise ApiError(400, f"n must be an integer in [1, {MAX_N}], got {n}", "n")


class Samples:
    """The requests of one prompt's `n` answers (chat's and completions' `n`).

    The first answer's request is submitted at once; the others once it has its first token. By then the
    prompt's full KV blocks are in the conductor's prefix cache (it keys them as the first request's batch
    is formed), so each later answer is admitted charged only for its own blocks and computes only the
    prompt's last, partly filled block before it samples (with `--no-prefix-cache` each computes the whole
    prompt: the counters on /metrics show which). Answer i samples with seed `seed + i` when the request
    gives a seed (so the answers differ, and a repeat gives the same n answers), else each with its own;
    greedy answers are equal. `deltas()` yields (answer, text delta, whether it ended) in the order the
    answers' tokens arrive; closing the group aborts every request not finished.
    """

    def __init__(self, server: ServerContext, chat: ChatRequest, n: int) -> None:
        self.server, self.chat, self.n = server, chat, n
        self.requests: list[Request] = [submit_chat(server, chat)]
        self.events = [ChatEvents(server, self.requests[0], chat.stop, chat.prompt_ids)]

    def _params(self, i: int) -> RequestParams:
        sampling = self.chat.params.sampling
        if sampling.seed is None:
            return self.chat.params
        seeded = dataclasses.replace(sampling, seed=sampling.seed if i == 0 else (sampling.seed + i) % _SEED_MOD)
        return msgspec.structs.replace(self.chat.params, sampling=seeded)

    def _submit_rest(self) -> None:
        """The other answers' requests (a full queue is an ApiError here: a stream has begun)."""
        for i in range(1, self.n):
            try:
                req = submit_chat(self.server, dataclasses.replace(self.chat, params=self._params(i)))
            except QueueFull as exc:
                raise ApiError(429, f"the server is at capacity: {exc}; retry later", code="queue_full") from None
            self.requests.append(req)
            self.events.append(ChatEvents(self.server, req, self.chat.stop, self.chat.prompt_ids))

    async def deltas(self) -> AsyncIterator[tuple[int, str, bool]]:
        """(answer, text delta, ended) as each answer's events come; an answer's error is raised."""
        if self.n == 1:                  # one answer (most requests): its events as they come, no task between
            done = False
            while not done:
                delta, done = await self.events[0].next()
                yield 0, delta, done
            return
        queue: asyncio.Queue[tuple[int, str, bool] | BaseException] = asyncio.Queue()

        async def pump(i: int) -> None:
            try:
                done = False
                while not done:
                    delta, done = await self.events[i].next()
                    await queue.put((i, delta, done))
            except BaseException as exc:     # an answer's error (or a bug) ends the group, never hangs it
                await queue.put(exc)
        tasks = [asyncio.ensure_future(pump(0))]
        open_answers = 1
        try:
            while open_answers:
                got = await queue.get()
                if isinstance(got, BaseException):
                    raise got
                i, delta, done = got
                if i == 0 and len(self.requests) < self.n and (self.requests[0].output_ids or done):
                    self._submit_rest()       # the prompt is cached: the others start from it
                    tasks += [asyncio.ensure_future(pump(j)) for j in range(1, self.n)]
                    open_answers += self.n - 1
                open_answers -= done
                yield i, delta, done
        finally:
            for task in tasks:
                task.cancel()

    def finish_reasons(self) -> list[str | None]:
        return [e.finish_reason for e in self.events]

    def usage(self) -> dict[str, int]:
        """The prompt once, every answer's tokens."""
        prompt = len(self.chat.prompt_ids)
        done = sum(len(r.output_ids) for r in self.requests)
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}

    def observe(self) -> None:
        for req in self.requests:
            self.server.observe_finished(req)

    def close(self) -> None:
        """Abort every answer's request not finished (a no-op for those that are)."""
        for req in self.requests:
            self.server.conductor.abort(req)


def _answer(text: str, finish: str | None, tools: ToolUse | None) -> dict[str, Any]:
    """A whole answer's `message` and `finish_reason`: its tool calls read out when the request has tools."""
    content, calls = split_calls(text, tools.names) if tools is not None and tools.read_calls else (text, [])
    if not calls:
        return {"message": {"role": "assistant", "content": text}, "finish_reason": finish}
    return {"message": {"role": "assistant", "content": content, "tool_calls": calls},
            "finish_reason": "tool_calls" if finish == "stop" else finish}


async def chat_completions(request: web.Request, body: ChatCompletionBody, server: ServerContext) -> web.StreamResponse:
    """The text chat of the model `server` serves (audio_chat.py's `chat_or_audio` routes here what does
    not ask for speech)."""
    # decoding images and audio is CPU work: off the loop that runs the conductor
    if has_image_parts(m.content for m in body.messages) or server.chat_inputs is not None:
        chat = await asyncio.to_thread(parse_chat, body, server)
    else:
        chat = parse_chat(body, server)
    samples = Samples(server, chat, body.n)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": server.model_id}
    try:
        if chat.is_sse:
            return await _send_events(request, chat, samples, head)
        texts = [""] * body.n
        async for i, delta, _ in samples.deltas():
            texts[i] += delta
        samples.observe()
        choices = [{"index": i, **_answer(text, events.finish_reason, chat.tools), "logprobs": events.take_logprobs()}
                   for i, (text, events) in enumerate(zip(texts, samples.events))]
        return web.json_response({**head, "object": "chat.completion", "choices": choices, "usage": samples.usage()})
    finally:
        samples.close()   # no-op when finished; frees everything on disconnect


async def _send_events(request: web.Request, chat: ChatRequest, samples: Samples,
                       head: dict[str, Any]) -> web.StreamResponse:
    resp = await sse_response(request)

    def chunk(i: int, delta: dict, finish: str | None) -> bytes:
        choice = {"index": i, "delta": delta, "finish_reason": finish, "logprobs": samples.events[i].take_logprobs()}
        return sse_data({**head, "object": "chat.completion.chunk", "choices": [choice]})

    # The role travels with each answer's first content (as vLLM sends it): clients time their first
    # chunk as TTFT, so a role chunk sent before any token is computed would flatter the server.
    role_sent = [False] * samples.n
    reading = chat.tools is not None and chat.tools.read_calls
    calls = [ToolCallStream(chat.tools.names) if reading else None for _ in range(samples.n)]

    def delta_of(i: int, fields: dict) -> dict:
        sent, role_sent[i] = role_sent[i], True
        return fields if sent else {"role": "assistant", **fields}
    try:
        async for i, delta, done in samples.deltas():
            found: list[dict] = []
            if calls[i] is not None:
                delta, found = calls[i].push(delta)
                delta += calls[i].finish() if done else ""
            if delta or (done and not role_sent[i] and not found):
                await resp.write(chunk(i, delta_of(i, {"content": delta}), None))
            if found:
                first = calls[i].calls - len(found)
                await resp.write(chunk(i, delta_of(i, {"tool_calls": tool_call_deltas(found, first)}), None))
            if done:
                finish = samples.events[i].finish_reason
                made_calls = calls[i] is not None and calls[i].calls
                await resp.write(chunk(i, {}, "tool_calls" if made_calls and finish == "stop" else finish))
        if chat.include_usage:
            await resp.write(sse_data({**head, "object": "chat.completion.chunk", "choices": [],
                                       "usage": samples.usage()}))
        samples.observe()
    except ApiError as err:
        await resp.write(sse_error(err))
    await resp.write(SSE_DONE)
    return resp
