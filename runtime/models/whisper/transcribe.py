"""Whisper's answer to /v1/audio/transcriptions and /v1/audio/translations (`FamilyServing.transcriber`).

The audio is decoded to 16 kHz and cut into 30 s windows, served in order as requests of the plan's
`transcribe` task: each window's decoder prompt (runtime/models/whisper/tokens.py) carries the text
of the window before it (the client's `prompt` for the first), as openai/whisper's long-form
transcription does with fixed windows. Without a `language` the model picks one on the first window
and the later windows are told it. verbose_json, srt and vtt ask the model for timestamps and read
segments from them (runtime/models/whisper/segments.py); json and text ask for none.
"""
from __future__ import annotations

from typing import Any

from aiohttp import web

from mstar_compiler.plan import Plan
from runtime.conductor.request import MediaInput
from runtime.entrypoints.http.audio_decode import decode_audio
from runtime.entrypoints.http.errors import ApiError, event_error
from runtime.entrypoints.http.params import resolve_params
from runtime.entrypoints.http.sse import sse_data, sse_response
from runtime.models.whisper.segments import Segment, srt, verbose, vtt, window_segments
from runtime.models.whisper.tokens import LANGUAGE_NAMES, LANGUAGES, WhisperTokens, check_tokenizer

TASK = "transcribe"
SAMPLE_RATE = 16000


class WhisperTranscriber:
    """Transcriptions and translations of a plan with a `whisper_decoder` fed by a `whisper_encoder`."""

    can_translate = True

    def __init__(self, plan: Plan) -> None:
        decoder = next(n for n in plan.nodes if n.kind == "whisper_decoder")
        encoder = next(n for n in plan.nodes if n.kind == "whisper_encoder")
        self.plan = plan
        self.tokens = WhisperTokens.of(decoder.dims)
        self.memory_rows = int(encoder.dims["max_source_positions"])
        self.window_samples = int(encoder.dims["chunk_length"]) * SAMPLE_RATE
        self.max_positions = int(decoder.dims["max_target_positions"])
        self.block = decoder.kv_pools[0].block_tokens if decoder.kv_pools else 1   # the memory is padded to it
        # text tokens a window may write (the graph's max_tokens default); the param's bound is the decoder's
        self.max_new = int(resolve_params(plan, {}).declared["max_tokens"])
        self._tokenizer_checked = False

    def _language(self, form: Any) -> str | None:
        language = getattr(form, "language", None)
        if language is None or language == "":
            return None
        code = language.strip().lower()
        if code in LANGUAGE_NAMES:          # openai/whisper takes the names too
            code = LANGUAGES[LANGUAGE_NAMES.index(code)]
        if self.tokens.language(code) is None:
            raise ApiError(400, f"language '{language}' is not one this model knows; give an ISO-639-1 code "
                           f"among {', '.join(self.tokens.languages)}, or none to have it detected", "language")
        return code

    async def answer(self, request: web.Request, server: Any, data: bytes, form: Any, task: str
                     ) -> web.StreamResponse:
        if not self._tokenizer_checked:
            try:
                check_tokenizer(self.tokens, server.tokenizer)
            except ValueError as exc:
                raise ApiError(500, str(exc), code="tokenizer_mismatch") from None
            self._tokenizer_checked = True
        language = self._language(form)
        fmt = form.response_format
        timestamps = fmt in ("verbose_json", "srt", "vtt")
        stream = bool(getattr(form, "stream", False))
        if stream and fmt != "json":
            raise ApiError(400, f"stream answers transcript.text events; response_format '{fmt}' cannot stream",
                           "stream")
        limit = resolve_params(self.plan, {}).declared.get("max_audio_seconds", 1800)
        wave = decode_audio(data, "file", SAMPLE_RATE, float(limit))
        previous = server.tokenizer.encode(form.prompt, add_special_tokens=False) if form.prompt else []
        if any(t >= self.tokens.eot for t in previous):
            raise ApiError(400, "prompt: the text encodes to special tokens", "prompt")
        resp = await sse_response(request) if stream else None
        segments: list[Segment] = []
        texts: list[str] = []
        for start in range(0, wave.shape[0], self.window_samples):
            window = wave[start:start + self.window_samples]
            output = await self._window(server, window, language, task, timestamps, previous, form.temperature,
                                        resp)
            if language is None:
                language = self.tokens.language_of(output[0]) if output else None
            text_ids = [t for t in output if t < self.tokens.eot]
            offset = start / SAMPLE_RATE
            segments += window_segments(self.tokens, output, offset, offset + window.shape[0] / SAMPLE_RATE,
                                        server.tokenizer.decode)
            texts.append(server.tokenizer.decode(text_ids))
            previous = text_ids
        text = "".join(texts)
        if resp is not None:
            await resp.write(sse_data({"type": "transcript.text.done", "text": text}))
            return resp
        if fmt == "text":
            return web.Response(text=text, content_type="text/plain")
        if fmt == "srt":
            return web.Response(text=srt(segments), content_type="text/plain")
        if fmt == "vtt":
            return web.Response(text=vtt(segments), content_type="text/vtt")
        if fmt == "verbose_json":
            name = LANGUAGE_NAMES[LANGUAGES.index(language)] if language else ""
            return web.json_response(verbose("translate" if task == "translate" else "transcribe", name,
                                             wave.shape[0] / SAMPLE_RATE, text, segments, form.temperature))
        return web.json_response({"text": text})

    async def _window(self, server: Any, window: Any, language: str | None, task: str, timestamps: bool,
                      previous: list[int], temperature: float, resp: web.StreamResponse | None) -> list[int]:
        """One window's output tokens (its language and task tokens first when the model picked them)."""
        prompt = self.tokens.prompt(self.memory_rows, language, task, timestamps, previous, self.block)
        # the language and what follows it: in the prompt when given, else written by the model first
        told = [] if language is not None else [0, *self.tokens.forced_after_language(task, timestamps)]
        room = self.max_positions - (len(prompt) + len(told) - self.memory_rows - (-self.memory_rows % self.block))
        params = resolve_params(self.plan, {"temperature": temperature,
                                            "max_tokens": min(self.max_new, room) + len(told)},
                                family={"task": task, "timestamps": timestamps})
        req = server.conductor.submit(TASK, params, [("audio", MediaInput(window, prompt))],
                                      frozenset({self.tokens.eot}), server.config.request_timeout_s)
        output: list[int] = []
        sent = ""
        try:
            while True:
                event = await req.events.get()
                if event.finish_reason == "error":
                    raise event_error(event)
                output += event.token_ids
                if resp is not None and event.token_ids:
                    text = server.tokenizer.decode([t for t in output if t < self.tokens.eot])
                    if len(text) > len(sent) and not text.endswith("\ufffd"):
                        await resp.write(sse_data({"type": "transcript.text.delta", "delta": text[len(sent):]}))
                        sent = text
                if event.finish_reason is not None:
                    break
            server.observe_finished(req)
        finally:
            server.conductor.abort(req)
        if resp is not None:
            text = server.tokenizer.decode([t for t in output if t < self.tokens.eot])
            if len(text) > len(sent):
                await resp.write(sse_data({"type": "transcript.text.delta", "delta": text[len(sent):]}))
        return output


def transcriber(plan: Plan) -> WhisperTranscriber | None:
    kinds = {n.kind for n in plan.nodes}
    if {"whisper_encoder", "whisper_decoder"} <= kinds and any(t.name == TASK for t in plan.tasks):
        return WhisperTranscriber(plan)
    return None
