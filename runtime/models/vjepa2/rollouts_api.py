"""POST /v1/rollouts: world-model rollouts (V-JEPA 2-AC), a native endpoint (OpenAI has none).

Body:
  model        the served model id
  frames       context clip, an even number of frames (tubelet 2: two frames per context
               step), each a base64 PNG (RGB; resized to the encoder's image size, scaled to
               [0, 1] and normalised with ImageNet mean/std as V-JEPA 2 does) or a nested
               array (3, H, W) of model-space pixels, used as given
  actions      (C + H - 1, action_dim) numbers: one per context step after the first, then
               one per predicted frame (C = number of frames / 2)
  states       (C, state_dim) end-effector states of the context steps (default zeros)
  horizon      H, frames to predict (default: what `actions` implies)
  stream       true: SSE, one `rollout.frame` event {index, shape [P, E], embeddings} per
               predicted frame as it is made, then `rollout.done`
  encoding_format  "float" (nested lists, default) or "base64" (float32 little-endian)

Answer: {"object": "rollout", "model", "horizon", "shape": [H, P, E], "embeddings": ...}:
the predicted frame representations (P patch tokens of width E per frame). Requests at
different steps and horizons batch together in the predictor's DynamicLoop; each keeps
a per-frame KV cache, freed when it ends (also on disconnect).
"""
from __future__ import annotations

import base64
import io
from typing import TYPE_CHECKING, Any

import torch
from aiohttp import web

from runtime.entrypoints.http.errors import ApiError, event_error
from runtime.entrypoints.http.params import resolve_params
from runtime.entrypoints.http.sse import SSE_DONE, sse_data, sse_error, sse_response
from runtime.transport.request_params import RequestParams

if TYPE_CHECKING:
    from runtime.entrypoints.http.context import ServerContext

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
TASK = "rollout"


def _png_frame(data: str, size: int, where: str) -> torch.Tensor:
    from PIL import Image
    try:
        image = Image.open(io.BytesIO(base64.b64decode(data, validate=True))).convert("RGB")
    except Exception as exc:   # PIL raises many kinds; all mean "not an image"
        raise ApiError(400, f"{where}: not a base64 PNG/JPEG image ({exc})", where) from None
    image = image.resize((size, size), Image.Resampling.BICUBIC)
    pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8).view(size, size, 3)
    x = pixels.permute(2, 0, 1).float() / 255.0                                 # (3, H, W)
    return (x - torch.tensor(IMAGENET_MEAN)[:, None, None]) / torch.tensor(IMAGENET_STD)[:, None, None]


def _array(value: Any, shape: tuple[int | None, ...], where: str) -> torch.Tensor:
    try:
        t = torch.tensor(value, dtype=torch.float32)
    except (TypeError, ValueError):
        raise ApiError(400, f"'{where}' must be a nested array of numbers", where) from None
    if t.dim() != len(shape) or any(want is not None and got != want for got, want in zip(t.shape, shape)):
        want = "x".join("N" if s is None else str(s) for s in shape)
        raise ApiError(400, f"'{where}' must have shape {want}, got {list(t.shape)}", where)
    return t


def _video(frames: Any, size: int) -> torch.Tensor:
    if not isinstance(frames, list) or not frames or len(frames) % 2:
        raise ApiError(400, "'frames' must be a non-empty list with an even number of frames (2 per step)", "frames")
    out = [_png_frame(f, size, f"frames[{i}]") if isinstance(f, str) else _array(f, (3, size, size), f"frames[{i}]")
           for i, f in enumerate(frames)]
    return torch.stack(out)                                                     # (F, 3, H, W)


def parse_rollout(server: ServerContext, body: Any) -> tuple[RequestParams, dict[str, torch.Tensor], bool, str]:
    """(params, port inputs, whether to answer as SSE events (the body's `stream`), encoding) of a rollout
    request; ApiError(400) if wrong."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    server.check_model(body.get("model"))
    if TASK not in {t.name for t in server.plan.tasks}:
        raise ApiError(400, f"the model '{server.model_id}' has no rollout task", "model")
    pred = next(n for n in server.plan.nodes if n.kind == "vjepa2_ac_predictor")
    video = _video(body.get("frames"), int(pred.dims["image_size"]))
    steps = video.shape[0] // int(pred.dims["tubelet_size"])
    actions = _array(body.get("actions"), (None, int(pred.dims["action_dim"])), "actions")
    states = (_array(body["states"], (steps, int(pred.dims["state_dim"])), "states") if body.get("states") is not None
              else torch.zeros(steps, int(pred.dims["state_dim"])))
    horizon = body.get("horizon", actions.shape[0] - steps + 1)
    params = resolve_params(server.plan, {"horizon": horizon})
    horizon = params.count("horizon")
    if actions.shape[0] != steps + horizon - 1:
        raise ApiError(400, f"a rollout of horizon {horizon} from {steps} context steps needs "
                       f"{steps + horizon - 1} actions, got {actions.shape[0]}", "actions")
    is_sse, encoding = body.get("stream", False), body.get("encoding_format", "float")
    if not isinstance(is_sse, bool) or encoding not in ("float", "base64"):
        raise ApiError(400, "'stream' must be a boolean and 'encoding_format' 'float' or 'base64'")
    ports = {"input:encoder.video": video, "input:predictor.actions": actions, "input:predictor.states": states}
    return params, ports, is_sse, encoding


def _encode(t: torch.Tensor, encoding: str) -> Any:
    t = t.float().contiguous()
    return base64.b64encode(t.numpy().astype("<f4").tobytes()).decode() if encoding == "base64" else t.tolist()


async def rollouts(request: web.Request) -> web.StreamResponse:
    server = request.app["mstar"]
    body = await server.read_json(request)
    server = server.serving(body.get("model")) if isinstance(body, dict) else server
    params, ports, is_sse, encoding = parse_rollout(server, body)
    req = server.conductor.submit(TASK, params, [], frozenset(), server.config.request_timeout_s, port_inputs=ports)
    key = next(f"{n.name}.prediction" for n in server.plan.nodes if n.kind == "vjepa2_ac_predictor")
    try:
        if is_sse:
            return await _send_events(request, server, req, key, encoding)
        frames = [f async for f in _frames(req, key)]
        server.observe_finished(req)
        stacked = torch.stack(frames)                                           # (H, P, E)
        return web.json_response({"object": "rollout", "model": server.model_id, "horizon": len(frames),
                                  "shape": list(stacked.shape), "embeddings": _encode(stacked, encoding)})
    finally:
        server.conductor.abort(req)


async def _frames(req: Any, key: str):
    """The request's predicted frames (P, E), in order, as they arrive."""
    while True:
        event = await req.events.get()
        if event.finish_reason == "error":
            raise event_error(event, "rollout")
        if key in event.tensors:
            yield event.tensors[key]
        if event.finish_reason is not None:
            return


async def _send_events(request: web.Request, server: ServerContext, req: Any, key: str,
                       encoding: str) -> web.StreamResponse:
    resp = await sse_response(request)
    index = 0
    try:
        async for frame in _frames(req, key):
            event = {"object": "rollout.frame", "index": index, "shape": list(frame.shape),
                     "embeddings": _encode(frame, encoding)}
            await resp.write(sse_data(event))
            index += 1
        server.observe_finished(req)
        await resp.write(sse_data({"object": "rollout.done", "horizon": index}))
    except ApiError as err:
        await resp.write(sse_error(err))
    await resp.write(SSE_DONE)
    return resp
