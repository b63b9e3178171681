"""Z-Image served through `mstar-run --weights ROOT` from a published-layout checkpoint, answering the real
`openai` client's image generations, against diffusers' ZImagePipeline on the same weights.

ROOT/Z-Image-Turbo/ holds tiny random transformers / diffusers parts saved as the published repository
lays them out (text_encoder/ and transformer/ as sharded checkpoints with their indexes, vae/, tokenizer/;
tools/bench/zimage_reference.py); the graph is graphs/zimage.yaml with its turbo mapping at tiny dims.
Each image equals the pipeline's for the same prompt, seed, size and steps, alone and while requests of
other sizes, step counts and prompts share the denoiser's calls with it.
"""
from __future__ import annotations

import base64
import concurrent.futures
import io
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import openai
import pytest
import yaml
from PIL import Image

from mstar_compiler.catalogue.bagel import KINDS as BAGEL_KINDS
from mstar_compiler.catalogue.zimage import ENCODER_PRESETS, PRESETS
from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from bench.zimage_reference import Reference
from tests.runtime.serving.conftest import Server, serve
from tests.runtime.serving.published_layouts import PRESET, published_preset

VAE_TINY = next(k for k in BAGEL_KINDS if k.kind == "vae_decoder").presets["tiny"]
DIMS = {"text_enc": ENCODER_PRESETS["tiny"], "dit": PRESETS["tiny"], "vae_dec": VAE_TINY}


@dataclass
class Served:
    server: Server
    ref: Reference

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.server.url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def zimage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("zimage")
    ref = Reference(DIMS)
    ref.write_repository(tmp / "root")
    graph = published_preset(tmp, "zimage", "turbo")
    data = yaml.safe_load(graph.read_text())
    data["presets"][PRESET]["nodes"] = {"vae_dec": "tiny"}
    graph.write_text(yaml.safe_dump(data, sort_keys=False))
    plan = tmp / "zimage.plan.bin"
    plan.write_bytes(compile_file(str(graph), Options(preset=PRESET)).data)
    for server in serve(str(plan), "--weights", str(tmp / "root")):
        yield Served(server, ref)


def _pixels(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def _generate(client: openai.OpenAI, prompt: str, size: str, seed: int, steps: int) -> np.ndarray:
    out = client.images.generate(model="z-image-turbo", prompt=prompt, size=size, response_format="b64_json",
                                 extra_body={"seed": seed, "steps": steps})
    return _pixels(out.data[0].b64_json)


def _assert_same_image(got: np.ndarray, want: np.ndarray) -> None:
    """At most one uint8 level apart, on under 1 % of the pixels (as BAGEL's tests allow)."""
    assert got.shape == want.shape
    diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
    # fp32 through ~20 layers whose reductions run in another order (batched, padded: reassociation) move a
    # value that rounds near a level's edge by one level
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01, (diff.max(), (diff > 0).mean())


def _counted(server: Server, name: str) -> float:
    """A batch-size histogram's count or sum; 0 before the node's first batch (the server exports no line yet)."""
    try:
        return server.metric(name)
    except KeyError:
        return 0.0


def test_an_image_equals_the_diffusers_pipeline(zimage: Served) -> None:
    got = _generate(zimage.client(), "a red fox in snow", "64x48", seed=7, steps=4)
    want = zimage.ref.images([zimage.ref.prompt_ids("a red fox in snow")], [7], 64, 48, 4)[0]
    assert got.shape == (48, 64, 3)
    assert 0.05 < ((got > 0) & (got < 255)).mean(), "a saturated image would hide differences"
    _assert_same_image(got, want)


def test_requests_at_different_steps_share_the_denoiser_and_keep_their_images(zimage: Served) -> None:
    """A long request first; three others of other sizes, prompts and step counts arrive while it denoises
    and their steps run in its calls (each call's rows at different steps of different schedules)."""
    long_job = ("a lighthouse at dusk", "64x64", 1, 100)
    jobs = [("two cats", "32x48", 2, 3), ("a bowl of pears", "48x32", 3, 5), ("rain over a city", "64x64", 4, 4)]
    count, rows = 'mstar_batch_size_count{node="dit"}', 'mstar_batch_size_sum{node="dit"}'
    before = _counted(zimage.server, count), _counted(zimage.server, rows)
    with concurrent.futures.ThreadPoolExecutor(len(jobs) + 1) as pool:
        first = pool.submit(_generate, zimage.client(), *long_job)
        time.sleep(0.05)    # sent first; the others arrive while its 100 steps run (they only need to overlap)
        futures = [first] + [pool.submit(_generate, zimage.client(), *job) for job in jobs]
        got = [f.result() for f in futures]
    calls, steps = _counted(zimage.server, count) - before[0], _counted(zimage.server, rows) - before[1]
    assert steps == sum(job[3] for job in [long_job, *jobs])
    assert calls < steps, "the later requests' steps should have shared the long one's denoiser calls"
    for (prompt, size, seed, n), image in zip([long_job, *jobs], got):
        width, height = (int(v) for v in size.split("x"))
        _assert_same_image(image, zimage.ref.images([zimage.ref.prompt_ids(prompt)], [seed], width, height, n)[0])


def test_bad_requests_are_openai_errors(zimage: Served) -> None:
    client = zimage.client()
    cases = [({"size": "60x64"}, "size"), ({"extra_body": {"guidance_scale": 4.0}}, "guidance_scale"),
             ({"prompt": "x" * 600}, "prompt"), ({"extra_body": {"steps": 0}}, "steps")]
    for kwargs, param in cases:
        body = {"model": "z-image-turbo", "prompt": "a fox", "size": "32x32", **kwargs}
        with pytest.raises(openai.BadRequestError) as err:
            client.images.generate(**body)
        assert err.value.body["param"] == param, err.value.body
    with pytest.raises(openai.BadRequestError) as err:
        client.images.edit(model="z-image-turbo", image=("a.png", _png(), "image/png"), prompt="bluer")
    assert err.value.body["code"] == "unsupported_task"
    assert _generate(client, "still serving", "32x32", seed=1, steps=2).shape == (32, 32, 3)


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (10, 20, 30)).save(buffer, format="PNG")
    return buffer.getvalue()
