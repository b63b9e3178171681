"""The seed models at the sizes people deploy, served by a real `mstar-run` on this CPU with seeded random weights
at the published shapes (issue 40): each serves one request end to end, and its worker's peak resident memory
(VmHWM: loading included) stays within 10 % over the plan `mstarc explain` shows for the rank (weights and KV
pools), and holds at least the weights; Orpheus-3B also with its LM quantized int4_g32 as it loads (issue 41). Paged KV pools are allocated whole at start; V-JEPA 2-AC's predictor
allocates each rollout's frame cache as it starts, so one rollout leaves most of its pool unallocated.

Marked slow (`pytest --slow`): each builds gigabytes of weights (Orpheus-3B: 6.2 GiB, a minute on 2 cores). The
CI-sized tests of the same code: tests/runtime/worker/test_loader_dtype.py (a bf16 model built without its fp32
copy), tests/runtime/parallel/test_cpu_linear.py (each packed weight its only copy), and
tests/runtime/weights/test_published_mappings.py (the presets' shapes against the published checkpoints).
"""
from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import openai
import pytest
import torch
from PIL import Image

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from mstar_compiler.units import parse_size
from runtime.launch.server import REPO, Server, http

PLAN_TOLERANCE = 0.10      # the bound: peak RSS at most 10 % over the plan


def _chat(srv: Server, model: str) -> None:
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=600)
    answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello."}],
                                            max_tokens=4)
    assert answer.usage.completion_tokens >= 1


def _speech(srv: Server, model: str) -> None:
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=600)
    audio = client.audio.speech.create(model=model, voice="tara", input="Hello there.", response_format="wav",
                                       extra_body={"max_tokens": 70})
    assert audio.content[:4] == b"RIFF" and len(audio.content) > 44


def _rollout(srv: Server, model: str) -> None:
    g = torch.Generator().manual_seed(0)
    body = {"model": model, "frames": torch.randn(4, 3, 256, 256, generator=g).tolist(),
            "actions": (0.1 * torch.randn(5, 7, generator=g)).tolist(),
            "states": (0.1 * torch.randn(2, 7, generator=g)).tolist()}
    status, answer = http("POST", f"{srv.url}/v1/rollouts", body, timeout=600)
    assert status == 200, answer


def _actions(srv: Server, model: str) -> None:
    pixels = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)   # pi05-base's camera side
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    body = {"model": model, "instruction": "pick up the cup", "images": [url, url], "state": [0.0] * 8, "steps": 2}
    status, answer = http("POST", f"{srv.url}/v1/actions", body, timeout=600)
    assert status == 200 and answer["object"] == "action_chunk", answer


# (graph, preset, --device-memory, the request, --quant)
CASES = [
    ("orpheus", "orpheus-3b", "12GiB", _speech, {}),
    ("orpheus", "orpheus-3b", "6GiB", _speech, {"lm": "int4_g32"}),     # issue 41: quantized as it loads
    ("vjepa2_ac", "vitg", "6GiB", _rollout, {}),
    ("qwen3_omni", "omni-wide", None, _chat, {}),
    ("bagel", "bagel-wide", None, _chat, {}),
    ("pi05", "pi05-base", None, _actions, {}),     # issue 44's robot policy at its published size
]


@pytest.mark.slow
@pytest.mark.parametrize("graph, preset, memory, request_one, quant", CASES,
                         ids=[c[1] + "".join(f"-{s}" for s in c[4].values()) for c in CASES])
def test_a_real_size_preset_serves_within_its_memory_plan(tmp_path: Path, graph: str, preset: str,
                                                          memory: str | None, request_one, quant) -> None:
    options = Options(preset=preset, device_memory=parse_size(memory) if memory else None, quant=quant)
    compiled = compile_file(str(REPO / "graphs" / f"{graph}.yaml"), options)
    path = tmp_path / "plan.bin"
    path.write_bytes(compiled.data)
    rank = compiled.plan.ranks[0]
    planned = rank.weight_bytes + rank.kv_bytes
    srv = Server(str(path), "--random-weights")
    try:
        srv.wait_ready(timeout=1200)
        request_one(srv, compiled.plan.model)
        peak = srv.peak_rss()
    finally:
        assert srv.stop() == 0
    ratio = peak / planned
    print(f"{preset}: peak RSS {peak / 2**30:.2f} GiB, plan {planned / 2**30:.2f} GiB "
          f"(weights {rank.weight_bytes / 2**30:.2f}, KV {rank.kv_bytes / 2**30:.2f}), {ratio:.3f}x")
    assert ratio <= 1 + PLAN_TOLERANCE, f"peak RSS {peak / 2**30:.2f} GiB is {ratio:.2f}x the plan"
    assert peak >= rank.weight_bytes, "the weights are not all resident: the plan counts what is not there"
