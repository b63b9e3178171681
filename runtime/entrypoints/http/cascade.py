"""A cascade served (mstar_compiler/passes/cascades.py): speech in, an LLM's answer spoken out.

POST /v1/chat/completions naming the plan's own model, with the user's audio as an `input_audio` part
of the last user message and `modalities: ["text", "audio"]`, runs the plan's cascade (graphs/
voice_agent.yaml's `converse`):
  * transcribe: the audio, transcribed by the recogniser's model (its transcription prompt, as
    /v1/audio/transcriptions writes it), greedily;
  * chat: the transcript (after the message's text parts) as the user's turn of the chat LM, the
    conversation's earlier text turns before it; its answer streams as text, sampled by the body's fields;
  * speak: the answer cut into clauses by the stage's `clauses:` policy, each clause one request of
    the speaking model (the body's `audio.voice`; `seed + i` for clause i), submitted the moment it is
    complete (four ahead of the one playing), its audio sent in clause order.
Text crosses from model to model as text: each model's own tokenizer reads and writes its own ids.
The answer is OpenAI's audio chat answer (audio_chat.py's `AudioAnswer`): `message.audio.transcript`
is the answer's text; the whole answer's message also carries `input_transcript`, what was heard, and its
usage `completion_tokens_at_first_audio`, how many tokens the chat LM had written when the first audio left.
"""
from __future__ import annotations

import asyncio
import base64
import itertools
from dataclasses import dataclass, field
from typing import Any

from mstar_compiler.plan import Cascade, ChunkPolicy
from runtime.conductor.request import Request
from runtime.entrypoints.http.audio_chat import AudioAnswer, audio_format
from runtime.entrypoints.http.audio_events import AudioEvents
from runtime.entrypoints.http.chat import (ChatEvents, ChatRequest, chat_messages, chat_prompt, given_fields,
                                           item_tokens, submit_chat)
from runtime.entrypoints.http.context import ServerContext
from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.params import resolve_params
from runtime.entrypoints.http.schemas import AudioOutput, ChatCompletionBody
from runtime.entrypoints.http.speech import submit_clauses, submit_text
from runtime.streams.text_clauses import TextClauses

MAX_AHEAD = 4          # clauses submitted beyond the one being spoken


@dataclass(frozen=True)
class Stage:
    role: str                        # "transcribe" | "chat" | "speak"
    model: ServerContext             # the served model whose task it runs
    task: str                        # that task, as the model names it
    clauses: ChunkPolicy | None


def conversation(server: ServerContext) -> Cascade | None:
    """The cascade a chat naming the plan's own model runs (its first), None when the plan has none."""
    mine = [c for c in server.plan.cascades if not server.plan.include_of(c.name)]
    return mine[0] if mine and not server.include else None


def stages(server: ServerContext, cascade: Cascade) -> list[Stage]:
    """The cascade's stages, each with the served model (the plan's own or an included one) that runs it."""
    by_include = {m.include: m for m in server.models_served()}
    out = []
    for s in cascade.stages:
        owner = server.plan.include_of(s.task)
        out.append(Stage(s.role, by_include[owner], s.task[len(owner) + 1:] if owner else s.task, s.clauses))
    return out


@dataclass
class _Clause:
    index: int
    text: str
    req: Request | None = None
    failed: ApiError | None = None


@dataclass
class _Spoken:
    clauses: list[_Clause] = field(default_factory=list)
    text_done: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)


def voice_of(server: ServerContext, cascade: Cascade, name: str, param: str) -> str:
    """The speaking stage's voice for a requested name (its model's own or one of OpenAI's); 400 if none."""
    speak = stages(server, cascade)[-1]
    if speak.role != "speak":
        raise ApiError(400, f"the cascade '{cascade.name}' answers in text only", "modalities")
    voice = speak.model.speech_model.speaker.voice(name)
    if voice is None:
        raise ApiError(400, f"unknown voice '{name}'", param)
    return voice


class CascadeAnswer(AudioAnswer):
    """One request of a cascade: its stages' requests and the answer they make together. `messages`: the
    conversation (OpenAI's chat messages); `chat_given`: the chat stage's params as a chat body gives them;
    `voice`: the speaking stage's voice (None: the answer is text only)."""

    def __init__(self, server: ServerContext, cascade: Cascade, messages: list[dict[str, Any]],
                 chat_given: dict[str, Any], voice: str | None, seed: int | None) -> None:
        self.stages = stages(server, cascade)
        self.voice = voice
        speaks = voice is not None
        super().__init__(server, self.stages[-1].model.speech_model.sample_rate if speaks else 24000)
        self.format = "pcm16"
        self.messages = messages
        chat = next(s for s in self.stages if s.role == "chat")
        self.chat_params = resolve_params(chat.model.plan, chat_given)    # checked before anything runs
        self.seed = seed
        self.heard = ""                                  # the transcript of the user's audio
        self.answer = ""                                 # the chat LM's answer, as written so far
        self.requests: list[Request] = []
        self.chat_req: Request | None = None
        self.num_prompt = 0                              # the chat LM's prompt tokens
        self.written_at_first_audio: int | None = None    # the answer's tokens when its first audio left
        self.spoken = _Spoken()
        self.out: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.tasks: list[asyncio.Task[None]] = []

    @classmethod
    def of_chat(cls, server: ServerContext, cascade: Cascade, body: ChatCompletionBody) -> CascadeAnswer:
        """The answer to a /v1/chat/completions body (audio out); ApiError(400) naming what is wrong."""
        if body.n != 1:
            raise ApiError(400, "n must be 1 with audio output (one spoken answer per request)", "n")
        voice = voice_of(server, cascade, (body.audio or AudioOutput()).voice, "audio.voice")
        answer = cls(server, cascade, chat_messages(body), given_fields(body), voice, body.seed)
        answer.format = audio_format(body)
        return answer

    async def start(self, hear: bool = True) -> None:
        """Hear the audio of the last user message (its request submitted here: a full queue is this request's
        429), then run the rest; `hear=False`: the messages are text already (a realtime session's)."""
        first = self.stages[0]
        heard = None
        if hear and first.role == "transcribe":
            heard = await submit_transcription(first, self._audio_part())
            self.requests.append(heard.req)
        self.tasks = [asyncio.create_task(self._write(heard)), asyncio.create_task(self._speak())]

    # ---- the text ----------------------------------------------------------------------------

    def _audio_part(self) -> dict[str, Any]:
        last = next((i for i in range(len(self.messages) - 1, -1, -1) if self.messages[i]["role"] == "user"), None)
        content = self.messages[last]["content"] if last is not None else None
        parts = [p for p in content if isinstance(p, dict) and p.get("type") == "input_audio"] \
            if isinstance(content, list) else []
        if len(parts) != 1:
            raise ApiError(400, "the last user message carries the audio to answer: one `input_audio` part",
                           f"messages[{last if last is not None else 0}].content")
        return parts[0]

    async def _write(self, heard: ChatEvents | None) -> None:
        """Transcribe, then chat: the answer's text out as it is written, its clauses to the speaker."""
        try:
            if heard is not None:
                self.heard = await _whole_text(heard)
            chat = next(s for s in self.stages if s.role == "chat")
            prompt = chat_prompt(chat.model, self._turns())
            self.num_prompt = len(prompt)
            stop = self.chat_params.sampling.stop
            request = ChatRequest(prompt, self.chat_params, stop, False, False, chat.task)
            self.chat_req = submit_chat(chat.model, request)
            self.requests.append(self.chat_req)
            events = ChatEvents(chat.model, self.chat_req, stop, prompt)
            cutter = TextClauses.of(self.stages[-1].clauses) if self.stages[-1].clauses else None
            done = False
            while not done:
                delta, done = await events.next()
                if delta:
                    self.answer += delta
                    await self.out.put(("text", delta))
                    self._release(cutter.append(delta) if cutter else [])
            self._release(cutter.finish() if cutter else [self.answer])     # no `clauses:`: spoken whole
        except Exception as exc:      # the client hears it (an SSE error, or the status of a whole answer)
            await self.out.put(("error", exc))
        finally:
            self.spoken.text_done = True
            self.spoken.wake.set()

    def _turns(self) -> list[dict[str, Any]]:
        """The conversation as the chat LM reads it: earlier turns' text, the last user turn's text parts
        followed by what was heard."""
        out = []
        for i, m in enumerate(self.messages):
            content = m["content"]
            if isinstance(content, list):
                texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
                content = " ".join(t for t in [*texts, self.heard if i == len(self.messages) - 1 else ""] if t)
            out.append({"role": m["role"], "content": content})
        return out

    # ---- the speech ---------------------------------------------------------------------------

    def _release(self, texts: list[str]) -> None:
        if self.voice is None:            # a text answer: nothing to speak
            return
        for text in texts:
            if text.strip():
                self.spoken.clauses.append(_Clause(len(self.spoken.clauses), text))
        self._admit(0)
        self.spoken.wake.set()

    def _admit(self, speaking: int) -> None:
        submit_clauses(itertools.islice(self.spoken.clauses, speaking, speaking + 1 + MAX_AHEAD), self._submit_clause)

    def _submit_clause(self, clause: _Clause) -> Request:
        tts = self.stages[-1].model
        seed = None if self.seed is None else self.seed + clause.index
        return submit_text(tts, tts.speech_model, self.voice, clause.text.strip(), {"seed": seed})

    async def _speak(self) -> None:
        """Each clause's audio, in order, once the clause is written; `done` after the last."""
        try:
            for i in itertools.count():
                while i >= len(self.spoken.clauses) and not self.spoken.text_done:
                    self.spoken.wake.clear()
                    await self.spoken.wake.wait()
                if i >= len(self.spoken.clauses):
                    break
                self._admit(i)
                clause = self.spoken.clauses[i]
                if clause.failed is not None:
                    raise clause.failed
                events = AudioEvents(self.stages[-1].model, clause.req, self.stages[-1].model.speech_model)
                done = False
                while not done:
                    _, audio, done = await events.next()
                    for piece in audio:
                        if self.written_at_first_audio is None and self.chat_req is not None:
                            self.written_at_first_audio = len(self.chat_req.output_ids)
                        await self.out.put(("audio", piece))
                        events.sent(piece)
                events.observe()
            await self.out.put(("done", None))
        except Exception as exc:
            await self.out.put(("error", exc))

    # ---- the answer ---------------------------------------------------------------------------

    async def next(self) -> tuple[str, list[Any], bool]:
        text, audio, done = "", [], False
        kind, value = await self.out.get()
        while True:
            if kind == "error":
                raise value
            if kind == "text":
                text += value
            elif kind == "audio":
                audio.append(value)
            else:
                done = True
            if done or self.out.empty():
                return text, audio, done
            kind, value = self.out.get_nowait()

    def finish_reason(self) -> str:
        req, budget = self.chat_req, self.chat_params.max_tokens
        return "length" if req is not None and budget is not None and len(req.output_ids) >= budget else "stop"

    def usage(self) -> dict[str, Any]:
        done = len(self.chat_req.output_ids) if self.chat_req is not None else 0
        return {"prompt_tokens": self.num_prompt, "completion_tokens": done, "total_tokens": self.num_prompt + done,
                # the server's own account of the overlap: the answer's tokens written when its first audio left
                "completion_tokens_at_first_audio": self.written_at_first_audio}

    def message_extra(self) -> dict[str, Any]:
        return {"input_transcript": self.heard}

    def close(self) -> None:
        """Abort what still runs (each request's `abort` is a no-op once it finished)."""
        for task in self.tasks:
            task.cancel()
        for req in [*self.requests, *(c.req for c in self.spoken.clauses if c.req is not None)]:
            self.server.conductor.abort(req)


async def submit_transcription(stage: Stage, part: dict[str, Any]) -> ChatEvents:
    """The transcribe stage's request for an `input_audio` part (its model's transcription prompt, greedy)."""
    asr = stage.model
    if asr.chat_inputs is None:
        raise ApiError(400, f"the model '{asr.model_id}' of stage transcribe does not take audio", "messages")
    messages = asr.chat_inputs.transcription_messages(part, None, None)
    items = await asyncio.to_thread(asr.chat_inputs.chat_items, messages, asr.tokenizer)
    chat = ChatRequest(item_tokens(items), resolve_params(asr.plan, {"temperature": 0.0}), (), False, False,
                       stage.task, items)
    return ChatEvents(asr, submit_chat(asr, chat), (), chat.prompt_ids)


async def transcribe(server: ServerContext, cascade: Cascade, wav_bytes: bytes) -> str:
    """What the cascade's transcribe stage hears in `wav_bytes` (a realtime session's committed buffer)."""
    stage = stages(server, cascade)[0]
    if stage.role != "transcribe":
        raise ApiError(400, f"the cascade '{cascade.name}' does not hear audio: it has no transcribe stage")
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav_bytes).decode(), "format": "wav"}}
    events = await submit_transcription(stage, part)
    try:
        return await _whole_text(events)
    finally:
        stage.model.conductor.abort(events.req)


async def _whole_text(events: ChatEvents) -> str:
    text, done = "", False
    while not done:
        delta, done = await events.next()
        text += delta
    return text


async def converse(request: Any, body: ChatCompletionBody, server: ServerContext, cascade: Cascade) -> Any:
    """The handler: the cascade's answer, streamed as SSE or whole."""
    answer = CascadeAnswer.of_chat(server, cascade, body)
    try:
        await answer.start()
        if body.stream:
            return await answer.send_events(request, bool(body.stream_options and body.stream_options.include_usage))
        return await answer.whole(answer.format)
    finally:
        answer.close()

