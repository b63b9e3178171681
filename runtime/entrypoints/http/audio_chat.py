"""POST /v1/chat/completions with `modalities: ["text", "audio"]`: text and speech together.

For a plan with a talker (Qwen3-Omni) the request runs the `voice_chat` task: the thinker
writes, the talker speaks what it writes, code2wav decodes chunks while the text still
decodes. As OpenAI's audio chat does:
  * streamed: SSE chunks whose `delta.audio` carries `transcript` (text deltas) or
    `data` (base64 16-bit PCM, 24 kHz mono; streaming requires `audio.format: "pcm16"`),
    in the order they are produced;
  * not streamed: `message.audio = {id, data, expires_at, transcript}` with `data` the
    whole answer as base64 WAV (or PCM for "pcm16"), `message.content` null.
audio_routes.py's `chat_or_audio` routes a chat request here when it asks for audio, else to the
text chat (or, for a plan's cascade, to cascade.py).
"""
from __future__ import annotations

import asyncio
import base64
import time
import uuid
from typing import Any

import msgspec
from aiohttp import web

from runtime.entrypoints.http.audio_events import AudioEvents
from runtime.entrypoints.http.audio_io import pcm16, wav
from runtime.entrypoints.http.chat import chat_messages, item_tokens
from runtime.entrypoints.http.context import ServerContext
from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.logprobs import LogprobsContent, missing_logprobs, requested_logprobs
from runtime.entrypoints.http.params import openai_field
from runtime.entrypoints.http.schemas import AudioOutput, ChatCompletionBody
from runtime.entrypoints.http.speech import speech_params
from runtime.entrypoints.http.sse import SSE_DONE, sse_data, sse_error, sse_response
from runtime.model_executor.sampling import SamplingParams
from runtime.text import TextOutput

AUDIO_FORMATS = ("wav", "pcm16")
EXPIRES_S = 3600


def _input_items(server: ServerContext, body: ChatCompletionBody,
                 voice: str) -> tuple[list[tuple[str, Any]], dict[str, Any], frozenset[int]]:
    """(the prompt's input items, values for the family's executors, stop ids): the family's reader
    for audio/image parts, else its speaker's chat prompt."""
    messages = chat_messages(body)
    items = server.chat_inputs.chat_items(messages, server.tokenizer) if server.chat_inputs else None
    if items:
        # the items are the prompt; the speaker's prompt gives only its params (the voice) and stops
        _, family, stops = server.speech_model.speaker.prompt(server, voice, "")
        return items, {**family, **server.chat_inputs.request_params(items)}, stops
    ids, family, stops = server.speech_model.speaker.chat_prompt(server, voice, _text_messages(messages))
    return [("text", ids)], family, stops


def _text_messages(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    out = []
    for i, m in enumerate(messages):
        content = m["content"]
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ApiError(400, f"messages[{i}].content: this endpoint takes text parts", f"messages[{i}]")
            content = "".join(p["text"] for p in content)
        out.append({"role": m["role"], "content": content})
    return out


def _parse(server: ServerContext,
           body: ChatCompletionBody) -> tuple[tuple[list[tuple[str, Any]], dict[str, Any], frozenset[int]], str]:
    server.check_model(body.model)
    if body.n != 1:
        raise ApiError(400, "n must be 1 with audio output (one spoken answer per request)", "n")
    model = server.speech_model
    if model is None or not model.speaker.can_chat:
        raise ApiError(400, f"the model '{server.model_id}' does not answer with audio in chat", "modalities")
    audio = body.audio or AudioOutput()
    speaker = model.speaker.voice(audio.voice)
    if speaker is None:
        raise ApiError(400, f"unknown voice '{audio.voice}'", "audio.voice")
    return _input_items(server, body, speaker), audio_format(body)


def audio_format(body: ChatCompletionBody) -> str:
    """The answer's audio format: the body's `audio.format`, else pcm16 streamed and wav whole."""
    audio = body.audio or AudioOutput()
    fmt = ("pcm16" if body.stream else "wav") if audio.format is msgspec.UNSET else audio.format
    if fmt not in AUDIO_FORMATS or (body.stream and fmt != "pcm16"):
        raise ApiError(400, "audio.format must be 'wav' or 'pcm16' ('pcm16' when streaming)", "audio.format")
    return fmt


async def audio_chat(request: web.Request, body: ChatCompletionBody, server: ServerContext) -> web.StreamResponse:
    # decoding audio and images is CPU work: off the loop that runs the conductor
    (items, family, stops), fmt = await asyncio.to_thread(_parse, server, body)
    model = server.speech_model
    fields = msgspec.structs.asdict(body)
    fields["max_tokens"] = openai_field(fields, "max_tokens")
    params = speech_params(server, fields, family, requested_logprobs(fields))
    req = server.conductor.submit(model.task, params, items, stops, server.config.request_timeout_s)
    events = AudioEvents(server, req, model)
    ctx = _Reply(server, events, len(item_tokens(items)))
    try:
        if body.stream:
            return await ctx.send_events(request, bool(body.stream_options and body.stream_options.include_usage))
        return await ctx.whole(fmt)
    finally:
        server.conductor.abort(req)


class AudioAnswer:
    """An audio chat answer written as OpenAI writes one (SSE chunks or one JSON body); a subclass gives
    its text and audio (`next`), finish reason, usage and what its client was sent."""

    server: ServerContext
    sample_rate: int

    def __init__(self, server: ServerContext, sample_rate: int) -> None:
        self.server, self.sample_rate = server, sample_rate
        self.cid, self.aid, self.created = f"chatcmpl-{uuid.uuid4().hex}", f"audio_{uuid.uuid4().hex}", int(time.time())

    async def next(self) -> tuple[str, list[Any], bool]:
        """(text delta, audio pieces, whether this was the last)."""
        raise NotImplementedError

    def sent(self, piece: Any) -> None:
        """`piece` of audio reached the client (playback metrics)."""

    def observe(self) -> None:
        """The answer is complete (its metrics)."""

    def take_logprobs(self) -> dict[str, Any] | None:
        return None

    def finish_reason(self) -> str:
        raise NotImplementedError

    def usage(self) -> dict[str, Any]:
        raise NotImplementedError

    def message_extra(self) -> dict[str, Any]:
        """Fields the whole answer's `message` carries besides OpenAI's."""
        return {}

    def _chunk(self, delta: dict, finish: str | None, logprobs: dict[str, Any] | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        body = {"id": self.cid, "object": "chat.completion.chunk", "created": self.created,
                "model": self.server.model_id, "choices": [choice]}
        return sse_data(body)

    async def send_events(self, request: web.Request, include_usage: bool) -> web.StreamResponse:
        resp = await sse_response(request)
        await resp.write(self._chunk({"role": "assistant", "content": None}, None))
        done = False
        try:
            while not done:
                text, audio, done = await self.next()
                if text:
                    await resp.write(self._chunk({"audio": {"id": self.aid, "transcript": text}}, None,
                                                 self.take_logprobs()))
                for piece in audio:
                    data = base64.b64encode(pcm16(piece)).decode()
                    await resp.write(self._chunk({"audio": {"id": self.aid, "data": data}}, None))
                    self.sent(piece)
            self.observe()
            await resp.write(self._chunk({"audio": {"id": self.aid, "expires_at": int(time.time()) + EXPIRES_S}},
                                         self.finish_reason(), self.take_logprobs()))
            if include_usage:
                usage = {"id": self.cid, "object": "chat.completion.chunk", "created": self.created,
                         "model": self.server.model_id, "choices": [], "usage": self.usage()}
                await resp.write(sse_data(usage))
        except ApiError as err:
            await resp.write(sse_error(err))
        await resp.write(SSE_DONE)
        return resp

    async def whole(self, fmt: str) -> web.Response:
        transcript, pcm, done = "", bytearray(), False
        while not done:
            text, audio, done = await self.next()
            transcript += text
            for piece in audio:
                pcm += pcm16(piece)
                self.sent(piece)
        self.observe()
        data = wav(bytes(pcm), self.sample_rate) if fmt == "wav" else bytes(pcm)
        audio = {"id": self.aid, "data": base64.b64encode(data).decode(),
                 "expires_at": int(time.time()) + EXPIRES_S, "transcript": transcript}
        message = {"role": "assistant", "content": None, "refusal": None, "audio": audio, **self.message_extra()}
        return web.json_response({
            "id": self.cid, "object": "chat.completion", "created": self.created, "model": self.server.model_id,
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason(),
                         "logprobs": self.take_logprobs()}],
            "usage": self.usage()})


class _Reply(AudioAnswer):
    """One audio chat answer: text decoded incrementally, audio as it comes."""

    def __init__(self, server: ServerContext, events: AudioEvents, num_prompt: int) -> None:
        super().__init__(server, events.model.sample_rate)
        self.events, self.num_prompt = events, num_prompt
        self.text = TextOutput(server.tokenizer, SamplingParams(), stop_ids=events.req.stop_token_ids)
        asked = events.req.params.sampling.logprobs is not None
        self.logprobs = LogprobsContent(server.tokenizer) if asked else None

    async def next(self) -> tuple[str, list[Any], bool]:
        ids, audio, done = await self.events.next()
        req = self.events.req
        if self.logprobs is not None:
            why = missing_logprobs(ids, self.events.logprobs)
            if why is not None:     # the handler's `finally` aborts the request
                raise ApiError(400, f"this model cannot answer 'logprobs': {why}", "logprobs")
            for token, logprob in zip(ids, self.events.logprobs):
                if token not in req.stop_token_ids:
                    self.logprobs.add(token, logprob)
        return self.text.push_ids(ids, is_last=done), audio, done

    def sent(self, piece: Any) -> None:
        self.events.sent(piece)

    def observe(self) -> None:
        self.events.observe()

    def take_logprobs(self) -> dict[str, Any] | None:
        return self.logprobs.take() if self.logprobs is not None else None

    def finish_reason(self) -> str:
        req = self.events.req
        budget = req.params.max_tokens
        return "length" if budget is not None and len(req.output_ids) >= budget else "stop"

    def usage(self) -> dict[str, int]:
        done = len(self.events.req.output_ids)
        return {"prompt_tokens": self.num_prompt, "completion_tokens": done, "total_tokens": self.num_prompt + done}
