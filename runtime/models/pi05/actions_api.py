"""POST /v1/actions: a robot policy's answer to one observation, an action chunk.

Request (JSON):

    {"model": "pi05-base", "instruction": "pick up the red cup",
     "images": ["data:image/png;base64,...", ...],   # one per camera, at most the model's max_cameras
     "state": [0.1, -0.4, ...],                       # the robot's state, normalised to [-1, 1]
     "steps": 10, "seed": 7}                          # optional: flow steps (the graph's param), noise seed

Response: {"object": "action_chunk", "model", "created", "steps", "shape": [chunk, max_action_dim],
"actions": [[...], ...]}, or `"encoding_format": "base64"` for little-endian float32 bytes.

Why this shape: a policy call is one observation in and one chunk out, not a conversation, so it is not a
chat completion; images travel as data URLs as they do in chat messages (any camera count up to the
model's, in the order the model was trained on); the state and the actions are in the model's normalised
space, because the statistics that map them to a robot's units belong to the robot's dataset, not to
the checkpoint the server holds (π0.5's processor applies them on the client side of the model as well).
The actions come padded to `max_action_dim`, as the model writes them: a robot reads its own first
dimensions. The prompt is π0.5's: one placeholder per image row, then `<bos>Task: {instruction},
State: {the state in 256 bins};\\nAction: `. Each camera image is resized to the tower's side
(bicubic, as SigLIP's image processor) and scaled to [-1, 1]. Requests batch with every other one at
each flow step, whatever step each is at.
"""
from __future__ import annotations

import base64
import secrets
import time
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import torch
from aiohttp import web
from PIL import Image

from runtime.entrypoints.http.errors import ApiError, event_error
from runtime.entrypoints.http.multimodal import data_url_bytes, decode_image
from runtime.entrypoints.http.params import resolve_params
from runtime.model_executor.images import pil_to_tensor
from runtime.text.tokenizer import TextTokenizer

if TYPE_CHECKING:
    from runtime.entrypoints.http.context import ServerContext

TASK = "act"
BINS = 256


class ActionsBody(msgspec.Struct):
    """POST /v1/actions (module docstring), parsed once at the edge; what only the plan can say (camera count,
    param bounds) and the state's range are checked by the handler."""

    instruction: str
    images: list[str]                    # one data URL per camera
    state: list[float]                   # normalised to [-1, 1]
    model: str | None = None             # None: the first served model that is a policy
    steps: int | None = None             # the graph's `steps` param (None: its default)
    seed: int | None = None              # the noise's seed (None: a random one)
    encoding_format: Literal["float", "base64"] = "float"


def _dims(server: ServerContext) -> dict[str, Any]:
    node = next((n for n in server.plan.nodes if n.kind == "pi05_prefix"), None)
    if node is None or TASK not in {t.name for t in server.plan.tasks}:
        raise ApiError(404, f"the model '{server.model_id}' is not a robot policy", "model", "model_not_found")
    return dict(node.dims)


def _acts(model: ServerContext) -> bool:
    """Whether a served model is a policy (the first one answers a request that names none)."""
    return any(n.kind == "pi05_prefix" for n in model.plan.nodes)


def _cameras(images: list[str], dims: dict[str, Any]) -> torch.Tensor:
    most = int(dims["max_cameras"])
    if not 1 <= len(images) <= most:
        raise ApiError(400, f"'images' must be a list of 1 to {most} camera images (data URLs)", "images")
    side = int(dims["image_size"])
    out = []
    for i, url in enumerate(images):
        field = f"images[{i}]"
        image = decode_image(data_url_bytes(url, field), field).convert("RGB")
        if image.size != (side, side):
            image = image.resize((side, side), Image.Resampling.BICUBIC)
        out.append(pil_to_tensor(image))
    return torch.stack(out)                                         # (F, 3, side, side)


def _state(value: list[float]) -> torch.Tensor:
    if not value:
        raise ApiError(400, "'state' must be a non-empty list of numbers (the state normalised to [-1, 1])", "state")
    state = torch.tensor(value, dtype=torch.float32)
    if not bool(((state >= -1) & (state <= 1)).all()):
        raise ApiError(400, "'state' must be normalised to [-1, 1] (the robot dataset's statistics map it)", "state")
    return state


def prompt_ids(server: ServerContext, dims: dict[str, Any], cameras: int, instruction: str,
               state: torch.Tensor) -> list[int]:
    """π0.5's prompt (module docstring) as token ids."""
    bins = torch.linspace(-1, 1, BINS + 1)[:-1]
    discrete = torch.bucketize(state, bins, right=True) - 1
    task = instruction.strip().replace("_", " ").replace("\n", " ")
    text = f"Task: {task}, State: {' '.join(map(str, discrete.tolist()))};\nAction: "
    tokenizer = server.tokenizer       # random weights have the byte tokenizer, which names no <bos>
    bos = tokenizer.special_tokens.get("bos_token", "") if isinstance(tokenizer, TextTokenizer) else ""
    rows = cameras * (int(dims["image_size"]) // int(dims["patch_size"])) ** 2
    return [int(dims["image_token_id"])] * rows + server.tokenizer.encode(bos + text, add_special_tokens=False)


def parse_action_request(server: ServerContext, body: ActionsBody) -> tuple[Any, dict[str, Any]]:
    """(params, port inputs) of an action request; ApiError(4xx) if wrong."""
    dims = _dims(server)
    if not body.instruction.strip():
        raise ApiError(400, "'instruction' must be a non-empty string", "instruction")
    cameras = _cameras(body.images, dims)
    state = _state(body.state)
    seed = secrets.randbits(31) if body.seed is None else body.seed
    if not 0 <= seed < 2**63:
        raise ApiError(400, f"'seed' must be a non-negative integer, got {seed}", "seed")
    params = resolve_params(server.plan, {"steps": body.steps, "seed": seed})
    prefix = next(n.name for n in server.plan.nodes if n.kind == "pi05_prefix")
    ids = prompt_ids(server, dims, cameras.shape[0], body.instruction, state)
    return params, {f"input:{prefix}.tokens": ids, f"input:{prefix}.cameras": cameras}


async def actions(request: web.Request) -> web.Response:
    server = request.app["mstar"]
    body = await server.read_body(request, ActionsBody)
    server = server.serving(body.model, able=_acts)
    params, ports = parse_action_request(server, body)
    req = server.conductor.submit(TASK, params, [], frozenset(), server.config.request_timeout_s, port_inputs=ports)
    key = next(f"{n.name}.actions" for n in server.plan.nodes if n.kind == "pi05_expert")
    chunk = None
    try:
        while True:
            event = await req.events.get()
            if event.finish_reason == "error":
                raise event_error(event, "actions")
            chunk = event.tensors.get(key, chunk)
            if event.finish_reason is not None:
                break
        server.observe_finished(req)
    finally:
        server.conductor.abort(req)
    if chunk is None:
        raise ApiError(500, f"the request ended ({req.finish_reason}) without an action chunk", code="no_actions")
    chunk = chunk.float().contiguous()
    data = (base64.b64encode(chunk.numpy().astype("<f4").tobytes()).decode() if body.encoding_format == "base64"
            else chunk.tolist())
    return web.json_response({"object": "action_chunk", "model": server.model_id, "created": int(time.time()),
                              "steps": params.count("steps"), "shape": list(chunk.shape), "actions": data})
