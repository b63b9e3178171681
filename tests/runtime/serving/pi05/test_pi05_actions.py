"""π0.5 served through `mstar-run --weights ROOT` from a published-layout checkpoint, answering POST /v1/actions,
against transformers' `PI05ForConditionalGeneration.sample_actions` on the same weights and noise.

ROOT/pi05_base/model.safetensors holds a tiny transformers π0.5's tensors under lerobot's published names
(tools/bench/pi05_reference.py) and a byte-level tokenizer with <bos>, <eos> and <image>; the graph is
graphs/pi05.yaml with its pi05-base mapping at tiny dims. The reference's input ids are built by the
`tokenizers` library from the prompt as PI05Processor writes it, its pixel values from the same PNGs, its
noise drawn from the request's seed.
"""
from __future__ import annotations

import base64
import concurrent.futures
import io
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from mstar_compiler.catalogue.pi05 import PRESETS
from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from bench import pi05_reference as ref
from bench.byte_tokenizer import write_byte_tokenizer
from tests.runtime.serving.conftest import Server, serve
from tests.runtime.serving.published_layouts import PRESET, published_preset

DIMS = PRESETS["tiny"]
PATCHES = (DIMS["image_size"] // DIMS["patch_size"]) ** 2


@dataclass
class Served:
    server: Server
    hf: Any
    tokenizer: Any

    def post(self, body: dict) -> tuple[int, dict]:
        request = urllib.request.Request(f"{self.server.url}/v1/actions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=300) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def pi05(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("pi05")
    hf = ref.model(DIMS)
    repo = tmp / "root" / "pi05_base"
    tokenizer = write_byte_tokenizer(repo, ["<bos>", "<eos>", "<image>"], eos="<eos>", bos="<bos>")
    save_file(ref.published_state(hf), str(repo / "model.safetensors"))
    plan = tmp / "pi05.plan.bin"
    plan.write_bytes(compile_file(str(published_preset(tmp, "pi05", "pi05-base")), Options(preset=PRESET)).data)
    for server in serve(str(plan), "--weights", str(tmp / "root")):
        yield Served(server, hf, tokenizer)


def _png(seed: int) -> tuple[str, torch.Tensor]:
    """A camera image as a data URL, and its pixels in [-1, 1] as SigLIP's processor scales them."""
    side = DIMS["image_size"]
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    return url, (torch.from_numpy(pixels).permute(2, 0, 1).float() / 255 - 0.5) / 0.5


def _expected(served: Served, instruction: str, cams: list[int], state: list[float], seed: int,
              steps: int) -> torch.Tensor:
    text = "<bos>" + ref.prompt_text(instruction, torch.tensor(state))
    ids = [DIMS["image_token_id"]] * (len(cams) * PATCHES) + served.tokenizer.encode(text).ids
    pixels = torch.stack([_png(c)[1] for c in cams])
    noise = torch.randn((DIMS["chunk_size"], DIMS["max_action_dim"]), generator=torch.Generator().manual_seed(seed))
    out = ref.sample(served.hf, torch.tensor([ids]), pixels[None], torch.ones(1, len(cams), dtype=torch.bool),
                     noise[None], steps)
    return out[0]


def _ask(served: Served, instruction: str, cams: list[int], state: list[float], seed: int, steps: int) -> dict:
    status, body = served.post({"model": "pi05-base", "instruction": instruction, "images": [_png(c)[0] for c in cams],
                                "state": state, "seed": seed, "steps": steps})
    assert status == 200, body
    return body


def _assert_close(got: dict, want: torch.Tensor) -> None:
    assert got["object"] == "action_chunk" and got["shape"] == [DIMS["chunk_size"], DIMS["max_action_dim"]]
    # fp32, a few tiny layers: only the order of reductions differs (padded batches, fused attention)
    torch.testing.assert_close(torch.tensor(got["actions"]), want, atol=1e-4, rtol=1e-4)


def _counted(server: Server, name: str) -> float:
    """A batch-size histogram's count or sum; 0 before the node's first batch (the server exports no line yet)."""
    try:
        return server.metric(name)
    except KeyError:
        return 0.0


def test_an_action_chunk_equals_transformers_sample_actions(pi05: Served) -> None:
    args = ("pick up the red cup", [1, 2], [0.1, -0.5, 0.9, -1.0], 5, 4)
    _assert_close(_ask(pi05, *args), _expected(pi05, *args))


def test_requests_at_different_steps_share_the_expert_and_keep_their_chunks(pi05: Served) -> None:
    """A long request first; three others (other cameras, states, step counts) arrive while it denoises and
    their steps run in its expert calls, each reading its own prefix."""
    long_job = ("open the drawer", [3], [0.0, 0.2], 11, 100)
    jobs = [("stack the blocks", [4, 5, 6], [0.5], 12, 3), ("wipe the table", [7, 8], [-0.3, 0.3, 0.0], 13, 5),
            ("close the lid", [9], [1.0, -1.0], 14, 7)]
    count, rows = 'mstar_batch_size_count{node="expert"}', 'mstar_batch_size_sum{node="expert"}'
    before = _counted(pi05.server, count), _counted(pi05.server, rows)
    with concurrent.futures.ThreadPoolExecutor(len(jobs) + 1) as pool:
        first = pool.submit(_ask, pi05, *long_job)
        time.sleep(0.05)    # sent first; the others arrive while its 100 steps run (they only need to overlap)
        futures = [first] + [pool.submit(_ask, pi05, *job) for job in jobs]
        got = [f.result() for f in futures]
    calls, steps = _counted(pi05.server, count) - before[0], _counted(pi05.server, rows) - before[1]
    assert steps == sum(job[4] for job in [long_job, *jobs])
    assert calls < steps, "the later requests' steps should have shared the long one's expert calls"
    for job, answer in zip([long_job, *jobs], got):
        assert answer["steps"] == job[4]
        _assert_close(answer, _expected(pi05, *job))


@pytest.mark.parametrize("change,param", [
    ({"images": []}, "images"), ({"images": "x"}, "images"), ({"state": [1.5]}, "state"), ({"state": []}, "state"),
    ({"instruction": " "}, "instruction"), ({"steps": 0}, "steps"), ({"images": ["http://example.com/a.png"]},
                                                                      "images[0]"),
])
def test_bad_requests_are_400s_naming_the_field(pi05: Served, change: dict, param: str) -> None:
    body = {"instruction": "grasp", "images": [_png(1)[0]], "state": [0.0], **change}
    status, answer = pi05.post(body)
    assert status == 400 and answer["error"]["param"] == param, answer


def test_four_cameras_are_more_than_the_model_has(pi05: Served) -> None:
    status, answer = pi05.post({"instruction": "grasp", "images": [_png(i)[0] for i in range(4)], "state": [0.0]})
    assert status == 400 and "1 to 3 camera images" in answer["error"]["message"]
    assert _ask(pi05, "still serving", [1], [0.0], 1, 2)["steps"] == 2
