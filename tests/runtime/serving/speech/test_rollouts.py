"""V-JEPA 2-AC tiny served by a real `mstar-run`: /v1/rollouts against the component rollout.

The oracle is the component itself with the worker's own weights (`load_rank`, the same
seeded initialisation): `cached_rollout` (the per-frame KV cache) and V-JEPA 2-AC's
native re-run over the whole context (`native_rollout`).
"""
from __future__ import annotations

import base64
import io
import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from PIL import Image

from mstar_compiler.plan import load_plan
from runtime.models.vjepa2 import cached_rollout, native_rollout
from runtime.worker.loader import load_rank
from tests.runtime.serving.conftest import compile_plan
from tests.runtime.serving.conftest import http as request_json
from tests.runtime.serving.speech.conftest import VJEPA, serve

SIZE, TOKENS, WIDTH = 32, 16, 48     # tiny: 32 px frames, patch 8 -> 16 tokens of width 48


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve(tmp_path_factory, "vjepa2_ac")


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    plan = load_plan(compile_plan(tmp_path_factory.mktemp("vjepa_oracle"), "vjepa2_ac", preset="tiny"))
    mods = load_rank(plan, 0, None)
    return mods["encoder"][0], mods["predictor"][0]


def clip(seed: int, num_frames: int = 4, horizon: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(video (F, 3, H, W), actions (C + H - 1, 7), states (C, 7))."""
    g = torch.Generator().manual_seed(seed)
    steps = num_frames // 2
    return (torch.randn(num_frames, 3, SIZE, SIZE, generator=g), 0.1 * torch.randn(steps + horizon - 1, 7, generator=g),
            0.1 * torch.randn(steps, 7, generator=g))


def body(video: torch.Tensor, actions: torch.Tensor, states: torch.Tensor, **extra) -> dict:
    return {"model": VJEPA, "frames": video.tolist(), "actions": actions.tolist(), "states": states.tolist(),
            "encoding_format": "base64", **extra}


def decode(answer: dict) -> torch.Tensor:
    raw = bytearray(base64.b64decode(answer["embeddings"]))
    return torch.frombuffer(raw, dtype=torch.float32).view(answer["shape"])


def rollout(server, payload: dict) -> torch.Tensor:
    status, answer = request_json("POST", f"{server.url}/v1/rollouts", payload)
    assert status == 200, answer
    return decode(answer)


@torch.inference_mode()
def test_rollout_over_http_equals_the_component_rollout(server, modules) -> None:
    encoder, predictor = modules
    video, actions, states = clip(0)
    got = rollout(server, body(video, actions, states))
    frames = encoder(video[None])
    cached = cached_rollout(predictor, frames, states[None], actions[None])[0]
    native = native_rollout(predictor, frames, states[None], actions[None], horizon=3)[0]
    assert got.shape == (3, TOKENS, WIDTH)
    # the server runs the cached rollout the test runs, over the same rows: measured exact; an ulp (1.2e-7 relative)
    # or a few at |x| <= 3.1 allowed where a kernel blocks the served batch otherwise
    assert torch.allclose(got, cached, atol=1e-6, rtol=0)
    # the native rollout re-runs the predictor over the whole trajectory: fp32 order differences fed back for 3
    # steps; measured max 1.6e-6, 16% of the bound
    assert torch.allclose(got, native, atol=1e-5, rtol=0)


def test_streamed_rollout_sends_one_frame_per_event(server) -> None:
    video, actions, states = clip(1, horizon=5)
    whole = rollout(server, body(video, actions, states))
    payload = json.dumps(body(video, actions, states, stream=True)).encode()
    req = urllib.request.Request(f"{server.url}/v1/rollouts", payload, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        events = [json.loads(line[6:]) for line in resp if line.startswith(b"data: {")]
    frames = [decode(e) for e in events if e["object"] == "rollout.frame"]
    assert [e["index"] for e in events if e["object"] == "rollout.frame"] == list(range(5))
    assert events[-1] == {"object": "rollout.done", "horizon": 5}
    assert torch.equal(torch.stack(frames), whole)


@torch.inference_mode()
def test_16_concurrent_rollouts_with_different_horizons(server, modules) -> None:
    encoder, predictor = modules
    horizons = [1 + i % 8 for i in range(16)]
    clips = [clip(10 + i, horizon=h) for i, h in enumerate(horizons)]
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda c: rollout(server, body(*c)), clips))
    assert [r.shape[0] for r in results] == horizons
    for (video, actions, states), got in zip(clips[:4], results[:4]):
        want = cached_rollout(predictor, encoder(video[None]), states[None], actions[None])[0]
        # batched: GEMMs over other row counts, whose fp32 order differences feed back over up to 8 steps (~2e-6
        # where the kernel follows the row count); measured exact here, on the panel GEMM
        assert torch.allclose(got, want, atol=1e-5, rtol=0)
    assert server.metric('mstar_batch_size_count{node="predictor"}') < sum(horizons) + 3   # steps were batched


def test_png_frames_are_accepted(server) -> None:
    png = io.BytesIO()
    Image.new("RGB", (48, 40), (200, 30, 90)).save(png, format="PNG")
    frame = base64.b64encode(png.getvalue()).decode()
    _, actions, states = clip(3, horizon=2)
    got = rollout(server, {"model": VJEPA, "frames": [frame, frame, frame, frame], "actions": actions.tolist(),
                           "states": states.tolist(), "encoding_format": "base64"})
    assert got.shape == (2, TOKENS, WIDTH) and torch.isfinite(got).all()


@pytest.mark.parametrize("change, field", [
    ({"frames": "not a list"}, "frames"),
    ({"actions": [[0.0] * 7] * 2}, "actions"),          # 2 context steps + horizon 3 need 4 actions
    ({"states": [[0.0] * 6] * 2}, "states"),
    ({"horizon": 99}, "horizon"),
])
def test_bad_rollout_requests_name_the_field(server, change, field) -> None:
    video, actions, states = clip(4)
    payload = {**body(video, actions, states), "horizon": 3, **change}
    status, answer = request_json("POST", f"{server.url}/v1/rollouts", payload)
    assert status == 400 and answer["error"]["param"] == field
