"""POST /v1/completions: OpenAI's completions over the plan's chat task (a raw prompt in, text out).

The prompt is taken as written: a string is tokenised with the tokenizer's own special tokens and no
chat template; token ids go to the model as they are. The answer is decoded, cut at stop strings and
counted as chat's is (chat.py's `ChatEvents`), streamed as `text_completion` chunks when asked, with
`usage` in a last chunk under `stream_options.include_usage` (what `vllm bench serve`'s default
backend reads). `logprobs: N` gives each answer token's log-probability and its N most likely
alternatives in the completions shape (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).
`n` answers share the prompt's prefill (chat.py's `Samples`). Not taken, each a 400 naming the field:
`best_of` above 1, `echo`, `suffix`, more than one prompt.
"""
from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec
from aiohttp import web

from runtime.entrypoints.http.chat import SAMPLING_KEYS, ChatRequest, Samples, check_n
from runtime.entrypoints.http.context import ServerContext
from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.limits import check_top_k, vocab_size
from runtime.entrypoints.http.params import resolve_params
from runtime.entrypoints.http.schemas import CompletionBody
from runtime.entrypoints.http.sse import SSE_DONE, sse_data, sse_error, sse_response
from runtime.entrypoints.http.tools import response_grammar, with_grammar
from runtime.model_executor.sampling.params import MAX_TOP_LOGPROBS


def parse_completion(body: CompletionBody, server: ServerContext) -> ChatRequest:
    """Check the typed body against the plan; ApiError(4xx) naming what is wrong."""
    server.check_model(body.model)
    if server.chat_node is None:
        raise ApiError(400, f"the model '{server.model_id}' has no chat task to complete text with")
    check_n(body.n)
    for field, refused, why in (("best_of", body.best_of not in (None, 1), "only best_of = 1 is supported"),
                                ("echo", body.echo, "echo is not supported by this server"),
                                ("suffix", body.suffix is not None, "suffix is not supported by this server")):
        if refused:
            raise ApiError(400, why, field)
    if body.logprobs is not None and not 0 <= body.logprobs <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"'logprobs' must be an integer in [0, {MAX_TOP_LOGPROBS}], got {body.logprobs}",
                       "logprobs")
    prompt_ids = _prompt_ids(body.prompt, server)
    fields = msgspec.structs.asdict(body)
    given = {k: fields[k] for k in SAMPLING_KEYS}
    given.update(max_tokens=body.max_tokens, stop=body.stop or None, stop_token_ids=body.stop_token_ids or None,
                 ignore_eos=body.ignore_eos, logprobs=body.logprobs)
    grammar = response_grammar(body.response_format, server.limits)
    params = with_grammar(server, resolve_params(server.plan, given), grammar, "response_format")
    check_top_k(params.sampling.effective_top_k or None, vocab_size(server.plan, server.chat_node))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return ChatRequest(prompt_ids, params, params.sampling.stop, body.stream, include_usage)


def _prompt_ids(prompt: str | list[Any], server: ServerContext) -> list[int]:
    """The one prompt's token ids: a string tokenised, ids checked against the vocabulary."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]                     # an array of one prompt
    if isinstance(prompt, str):
        ids = server.tokenizer.encode(prompt, add_special_tokens=True)
    elif all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
    elif all(isinstance(p, (str, list)) for p in prompt):
        raise ApiError(400, f"one prompt per request: this one has {len(prompt)} (send each as a request of "
                            "its own)", "prompt")
    else:
        raise ApiError(400, CompletionBody.FIELD_ERRORS["prompt"], "prompt")
    if not ids:
        raise ApiError(400, "'prompt' is empty", "prompt")
    vocab = vocab_size(server.plan, server.chat_node)
    bad = [t for t in ids if t < 0 or (vocab is not None and t >= vocab)]
    if bad:
        raise ApiError(400, f"'prompt': token ids {bad[:5]} are not in this model's vocabulary "
                            f"(0..{vocab - 1 if vocab else '?'})", "prompt")
    return ids


class CompletionLogprobs:
    """Chat's `logprobs.content` entries (logprobs.py) in the completions shape, offsets into the answer."""

    def __init__(self) -> None:
        self.offset = 0

    def shape(self, taken: dict[str, Any] | None) -> dict[str, Any] | None:
        if taken is None:
            return None
        entries = taken["content"]
        offsets = []
        for entry in entries:
            offsets.append(self.offset)
            self.offset += len(entry["token"])
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
                "text_offset": offsets}


async def completions(request: web.Request) -> web.StreamResponse:
    server: ServerContext = request.app["mstar"]
    body = await server.read_body(request, CompletionBody)
    server = server.serving(body.model)
    chat = parse_completion(body, server)
    samples = Samples(server, chat, body.n)
    logprobs = [CompletionLogprobs() for _ in range(body.n)]
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": server.model_id}
    try:
        if chat.is_sse:
            return await _send_events(request, chat, samples, logprobs, head)
        texts = [""] * body.n
        async for i, delta, _ in samples.deltas():
            texts[i] += delta
        samples.observe()
        choices = [{"index": i, "text": text, "logprobs": lp.shape(events.take_logprobs()),
                    "finish_reason": events.finish_reason}
                   for i, (text, events, lp) in enumerate(zip(texts, samples.events, logprobs))]
        return web.json_response({**head, "choices": choices, "usage": samples.usage()})
    finally:
        samples.close()   # no-op when finished; frees everything on disconnect


async def _send_events(request: web.Request, chat: ChatRequest, samples: Samples, logprobs: list[CompletionLogprobs],
                       head: dict[str, Any]) -> web.StreamResponse:
    """Chunks that carry text (a client times its first as TTFT), each answer's finish reason, usage if asked."""
    resp = await sse_response(request)

    def chunk(i: int, text: str, finish: str | None) -> bytes:
        choice = {"index": i, "text": text, "logprobs": logprobs[i].shape(samples.events[i].take_logprobs()),
                  "finish_reason": finish}
        return sse_data({**head, "choices": [choice]})

    try:
        async for i, delta, done in samples.deltas():
            if delta:
                await resp.write(chunk(i, delta, None))
            if done:
                await resp.write(chunk(i, "", samples.events[i].finish_reason))
        if chat.include_usage:
            await resp.write(sse_data({**head, "choices": [], "usage": samples.usage()}))
        samples.observe()
    except ApiError as err:
        await resp.write(sse_error(err))
    await resp.write(SSE_DONE)
    return resp
