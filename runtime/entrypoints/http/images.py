"""POST /v1/images/generations and /v1/images/edits: OpenAI's image API over a drawing model's tasks.

A family whose models draw declares a `Drawer` (runtime/entrypoints/http/families.py): its tasks, the
sizes it can draw, how its prompt is written and its names for OpenAI's fields; without one (no model
of the server draws) both routes answer 404. Fields as OpenAI names them: `prompt`, `n`, `size` ("WxH"
or "auto"), `response_format` (only "b64_json": the server keeps no files), `output_format` (only
"png"); edits take `image` / `image[]` files as multipart/form-data (the openai client's way) or base64
data URLs in a JSON body. The plan's params are extra body fields (`steps`, ...; or a drawer's names for
them, e.g. `guidance_scale`) and so is `seed`. `n` images are n requests with seeds
seed, seed + 1, ... that batch with every other request. An edit's output has its last input image's
(prepared) size unless `size` says.
"""
from __future__ import annotations

import asyncio
import base64
import dataclasses
import re
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import torch
from aiohttp import web

from runtime.conductor.request import Request
from runtime.model_executor.images import png_bytes
from runtime.entrypoints.http.errors import ApiError, event_error
from runtime.entrypoints.http.multimodal import data_url_bytes, image_input, image_item
from runtime.entrypoints.http.params import resolve_params
from runtime.transport.request_params import RequestParams

if TYPE_CHECKING:
    from runtime.entrypoints.http.context import ServerContext
    from runtime.entrypoints.http.families import Drawer

MAX_IMAGES = 10
_SIZE = re.compile(r"^(\d+)x(\d+)$")


@dataclass
class ImageJob:
    """A checked image request: n runs of one task."""

    task: str
    items: list[tuple[str, Any]]   # request input items (images, then the prompt)
    params: RequestParams          # the first image's; image i draws from seed + i (`params_of`)
    n: int
    seed: int
    size: tuple[int, int]          # (width, height) of the output

    def params_of(self, i: int) -> RequestParams:
        sampling = dataclasses.replace(self.params.sampling, seed=self.seed + i)
        return msgspec.structs.replace(self.params, sampling=sampling)


def _integer(value: Any, field: str, lo: int, hi: int) -> int:
    """An integer field (form fields arrive as strings); 400 outside [lo, hi]."""
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ApiError(400, f"'{field}' must be an integer between {lo} and {hi}, got {value!r}", field)
    return value


def _coerced(value: Any, kind: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return int(value) if kind == "integer" else float(value) if kind == "number" else value
    except ValueError:
        return value    # resolve_params names the field and the type it wants


def _plan_params(server: ServerContext, drawer: Drawer, fields: dict[str, Any], task: str, seed: int,
                 size: tuple[int, int]) -> RequestParams:
    specs = {p.name: p for p in server.plan.params}
    given = {}
    for name, value in fields.items():
        name = drawer.aliases.get(name, name)
        if name in specs:
            given[name] = _coerced(value, specs[name].type)
    for name, value in drawer.task_defaults(task).items():
        if name in specs and given.get(name) is None:
            given[name] = value
    return resolve_params(server.plan, {**given, "seed": seed}, {"width": size[0], "height": size[1]})


def _size(value: Any, default: tuple[int, int], drawer: Drawer) -> tuple[int, int]:
    if value is None or value == "auto":
        return default
    match = _SIZE.match(value) if isinstance(value, str) else None
    if match is None:
        raise ApiError(400, f"'size' must be 'WIDTHxHEIGHT' or 'auto', got {value!r}", "size")
    width, height = int(match[1]), int(match[2])
    problem = drawer.size_problem(width, height)
    if problem:
        raise ApiError(400, f"'size' {value}: {problem}", "size")
    return width, height


def _check_formats(fields: dict[str, Any], drawer: Drawer) -> None:
    if fields.get("response_format") not in (None, "b64_json"):
        raise ApiError(400, "'response_format' must be 'b64_json' (this server returns images inline)",
                       "response_format")
    if fields.get("output_format") not in (None, "png"):
        raise ApiError(400, "'output_format' must be 'png'", "output_format")
    if fields.get("stream") in (True, "true"):
        raise ApiError(400, "streaming image generation is not supported", "stream")
    if fields.get("mask") is not None:
        raise ApiError(400, f"masks are not supported: {drawer.mask_refusal}", "mask")


def _draws(model: ServerContext) -> bool:
    """Whether a served model draws images (a server of several models may serve one that does)."""
    return model.drawer is not None


def parse_job(server: ServerContext, fields: dict[str, Any], images: list[torch.Tensor], edit: bool) -> ImageJob:
    """Check an image request's fields against OpenAI's shape and the plan; ApiError(4xx) if wrong."""
    drawer = server.drawer
    task = "" if drawer is None else drawer.edit_task if edit else drawer.generate_task
    if not task or task not in {t.name for t in server.plan.tasks}:
        what = "image edits" if edit else "image generation"
        raise ApiError(400, f"the model '{server.model_id}' does not serve {what}", "model", "unsupported_task")
    if fields.get("model") is not None:
        server.check_model(fields["model"])
    prompt = fields.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "'prompt' must be a non-empty string", "prompt")
    _check_formats(fields, drawer)
    drawer.check_fields(fields)
    n = _integer(fields.get("n", 1), "n", 1, MAX_IMAGES)
    seed = _integer(fields["seed"], "seed", 0, 2**63 - 1) if fields.get("seed") is not None else secrets.randbits(31)
    default = (images[-1].shape[1], images[-1].shape[0]) if images else drawer.default_size()
    size = _size(fields.get("size"), default, drawer)
    params = _plan_params(server, drawer, fields, task, seed, size)
    items = [*(("image", image_input(server.plan, im)) for im in images), ("text", drawer.prompt_ids(server, prompt))]
    return ImageJob(task, items, params, n, seed, size)


async def _image_of(server: ServerContext, req: Request) -> torch.Tensor:
    image = None
    while True:
        event = await req.events.get()
        image = next((t for t in event.tensors.values() if t.dim() == 3), image)
        if event.finish_reason == "error":
            raise event_error(event)
        if event.finish_reason is not None:
            break
    server.observe_finished(req)
    if image is None:
        raise ApiError(500, f"the request ended ({req.finish_reason}) without an image", code="no_image")
    return image


async def run_job(server: ServerContext, job: ImageJob) -> web.Response:
    """Submit the job's n requests, wait for all, answer with their PNGs."""
    reqs = [server.conductor.submit(job.task, job.params_of(i), job.items, frozenset(),
                                    server.config.request_timeout_s) for i in range(job.n)]
    try:
        images = await asyncio.gather(*(_image_of(server, r) for r in reqs))
    finally:
        for r in reqs:
            server.conductor.abort(r)   # no-op when finished; frees everything on error or disconnect
    pngs = await asyncio.gather(*(asyncio.to_thread(png_bytes, im) for im in images))
    return web.json_response({
        "created": int(time.time()), "output_format": "png", "size": f"{job.size[0]}x{job.size[1]}",
        "data": [{"b64_json": base64.b64encode(p).decode(), "revised_prompt": None} for p in pngs]})


async def images_generations(request: web.Request) -> web.Response:
    server = request.app["mstar"]
    body = await server.read_json(request)
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    server = _drawing(server, body.get("model"))
    return await run_job(server, parse_job(server, body, [], edit=False))


def _drawing(server: ServerContext, model: Any) -> ServerContext:
    """The served model a request names, or the first that draws; 404 when no model of the server draws."""
    if not any(_draws(m) for m in server.models_served()):
        raise ApiError(404, "no model of this server draws images", "model", "model_not_found")
    return server.serving(model, able=_draws)


async def _edit_fields(request: web.Request, server: ServerContext) -> tuple[dict[str, Any], list[bytes]]:
    """Fields and image bytes of an edit: multipart/form-data, or JSON with data URLs."""
    if request.content_type != "multipart/form-data":
        body = await server.read_json(request)
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        urls = body.get("image")
        urls = urls if isinstance(urls, list) else [urls] if urls is not None else []
        return body, [data_url_bytes(u.get("image_url") if isinstance(u, dict) else u, "image") for u in urls]
    if server.draining:
        raise ApiError(503, "the server is shutting down", code="shutting_down")
    form = await request.post()
    fields, images = {}, []
    for key, value in form.items():
        if key in ("image", "image[]") and isinstance(value, web.FileField):
            images.append(value.file.read())
        elif isinstance(value, web.FileField):
            fields[key] = value.filename
        else:
            fields[key] = value
    return fields, images


async def images_edits(request: web.Request) -> web.Response:
    server = request.app["mstar"]
    fields, blobs = await _edit_fields(request, server)
    server = _drawing(server, fields.get("model"))
    if not blobs:
        raise ApiError(400, "'image' is required: one or more image files", "image")
    if len(blobs) > MAX_IMAGES:
        raise ApiError(400, f"at most {MAX_IMAGES} images per edit", "image")
    images = await asyncio.to_thread(lambda: [image_item(server.plan, blob, "image") for blob in blobs])
    return await run_job(server, parse_job(server, fields, images, edit=True))
