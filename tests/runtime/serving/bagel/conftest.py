"""BAGEL tiny served by real `mstar-run` processes: one rank (`single`) and three (`cfg_parallel`).

Workers run torch on one thread: on a shared 2-core machine a second OpenMP thread
spin-waits and a tiny forward takes ~1 s instead of ~2 ms.
"""
from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor
import io
from typing import Iterator

import numpy as np
import openai
import pytest
from PIL import Image

from tests.runtime.serving.conftest import Server, serve_tiny

MODEL = "bagel-7b-mot"


def _serve(tmp_path_factory: pytest.TempPathFactory, placement: str, *extra: str) -> Iterator[Server]:
    yield from serve_tiny(tmp_path_factory, "bagel", placement, *extra)


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Iterator[Server]:
    yield from _serve(tmp_path_factory, "single")


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory) -> Iterator[Server]:
    yield from _serve(tmp_path_factory, "cfg_parallel")


def client_of(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(single) -> openai.OpenAI:
    return client_of(single)


def pixels(b64: str) -> np.ndarray:
    """A b64 PNG from the API -> (H, W, 3) int array (checks it is a PNG)."""
    data = base64.b64decode(b64)
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(np.int64)


def png(width: int, height: int, seed: int = 0) -> bytes:
    """A PNG of smooth random colours."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
    image = Image.fromarray(small).resize((width, height), Image.BILINEAR)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


GEN = {"seed": 3, "steps": 4}


def generate(client: openai.OpenAI, prompt: str = "a red cube", size: str = "64x48", **extra):
    return client.images.generate(model=MODEL, prompt=prompt, size=size, extra_body={**GEN, **extra})


def edit(client: openai.OpenAI, image: bytes, prompt: str = "make it blue", **kw):
    extra = {**GEN, **kw.pop("extra", {})}
    return client.images.edit(model=MODEL, image=("in.png", image, "image/png"), prompt=prompt, extra_body=extra, **kw)


def chat_with_image(client: openai.OpenAI, image: bytes, question: str = "what is in the picture?", **extra):
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": question}]
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                          max_tokens=6, temperature=0, **extra)


def alone_and_together(client: openai.OpenAI) -> list[tuple[np.ndarray, np.ndarray]]:
    """Three seeded images drawn one at a time, then again concurrently beside a chat with an image."""
    solo = [pixels(generate(client, prompt=f"cube {i}", seed=i).data[0].b64_json) for i in range(3)]
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(generate, client, f"cube {i}", seed=i) for i in range(3)]
        answer = pool.submit(chat_with_image, client, png(40, 40))
        together = [pixels(f.result().data[0].b64_json) for f in futures]
        answer.result()
    return list(zip(solo, together))
