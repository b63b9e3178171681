"""POST /v1/tasks/{task}: run any task of the plan with its declared params (native endpoint).

Body: {"params": {...}, "inputs": [{"type": "text", "text": "..."} | {"type": "tokens", "ids": [...]}]};
`params` holds the graph's declared params and the sampling fields (`seed`, `top_k`, ...,
`stop_token_ids`, `ignore_eos`); any other name is a 400 naming it. A task of a model the plan includes
(`llm.chat`) runs as that model runs it: its params are named as its own graph names them (`max_tokens`).
Answer: {"task", "finish_reason", "token_ids", "text", "tensors": {"<node>.<port>":
{"dtype", "shape", "data": base64 of the raw little-endian bytes}}}; a port that streamed several
tensors (audio chunks, predicted frames) gives them concatenated along their first axis.
"""
from __future__ import annotations

import base64

import torch
from aiohttp import web

from runtime.entrypoints.http.context import ServerContext
from runtime.entrypoints.http.errors import ApiError, event_error
from runtime.entrypoints.http.limits import check_context, check_token_ids, max_context, vocab_size
from runtime.entrypoints.http.params import resolve_params
from runtime.entrypoints.http.schemas import TaskBody, TextInput
from runtime.text import output_text
from runtime.transport.request_params import RequestParams


def _inputs(body: TaskBody, server: ServerContext) -> list[tuple[str, list[int]]]:
    out = []
    for i, item in enumerate(body.inputs):
        if isinstance(item, TextInput):
            out.append(("text", server.tokenizer.encode(item.text)))
        else:
            check_token_ids(item.ids, vocab_size(server.plan, server.chat_node), f"inputs[{i}].ids")
            out.append(("text", item.ids))
    return out


def _tensor_json(t: torch.Tensor) -> dict:
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
            "data": base64.b64encode(t.contiguous().numpy().tobytes()).decode()}


def _check_honoured(params: RequestParams) -> None:
    """This endpoint answers token ids and tensors: stop strings and logprobs would go unused."""
    for field, value in (("stop", params.sampling.stop), ("logprobs", params.sampling.logprobs)):
        if value is not None and value != ():
            raise ApiError(400, f"params.{field}: the native task endpoint does not take it "
                           "(stop_token_ids ends a request at a token; /v1/chat/completions takes stop strings)", field)


async def run_task(request: web.Request) -> web.Response:
    server: ServerContext = request.app["mstar"]
    task = request.match_info["task"]
    owner = server.plan.include_of(task)
    if owner:       # an included model's task (`llm.chat`): run as that model runs it, its params its own names
        server, task = next(m for m in server.models_served() if m.include == owner), task[len(owner) + 1:]
    if task not in {t.name for t in server.plan.tasks}:
        raise ApiError(404, f"unknown task '{task}'; this model has: {', '.join(t.name for t in server.plan.tasks)}",
                       "task", "task_not_found")
    fed = [tr.per_chunk for tr in server.plan.task(task).tracks
           if tr.per_chunk and next(s for s in server.plan.streams if s.name == tr.per_chunk).is_client_fed]
    if fed:     # this endpoint has no way to push the stream's items: the request would wait for ever
        raise ApiError(400, f"task '{task}' reads the client-fed stream '{fed[0]}', which this endpoint cannot "
                            "feed; its client streams it (a realtime session: GET /v1/realtime)", "task",
                       "task_needs_stream")
    body = await server.read_body(request, TaskBody)
    params = resolve_params(server.plan, body.params)
    _check_honoured(params)
    inputs = _inputs(body, server)
    if params.max_tokens is not None:
        num_prompt = sum(len(ids) for _, ids in inputs)
        limit = max_context(server.plan, server.chat_node, kv_pool=False)
        check_context(num_prompt, params.max_tokens, limit)
    stops = server.stop_token_ids(params.sampling.stop_token_ids, params.sampling.ignore_eos)
    req = server.conductor.submit(task, params, inputs, stops, server.config.request_timeout_s)
    chunks: dict[str, list[torch.Tensor]] = {}
    try:
        while True:
            event = await req.events.get()
            for key, t in event.tensors.items():
                chunks.setdefault(key, []).append(t)
            if event.finish_reason == "error":
                raise event_error(event)
            if event.finish_reason is not None:
                break
    finally:
        server.conductor.abort(req)
    tensors = {key: _tensor_json(torch.cat(ts) if len(ts) > 1 else ts[0]) for key, ts in chunks.items()}
    text = output_text(server.tokenizer, req.output_ids, req.stop_token_ids)
    return web.json_response({"task": task, "finish_reason": req.finish_reason, "token_ids": req.output_ids,
                              "text": text, "tensors": tensors})
