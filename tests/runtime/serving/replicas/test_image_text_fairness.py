"""Image and text work sharing one rank (BAGEL tiny, `single`): a T2I's many flow steps and
chat decode steps interleave, so a short chat finishes while a long image is still drawing,
and an image completes while long chats keep streaming."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import openai
import pytest

from tests.runtime.serving.conftest import Server
from tests.runtime.serving.bagel.conftest import MODEL, _serve, client_of

STEPS = 200    # the most a request may ask: ~200 LM + CFG Runs


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    yield from _serve(tmp_path_factory, "single")


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return client_of(server)


def _wait_running(server: Server, n: int) -> None:
    deadline = time.monotonic() + 30
    while server.metric("mstar_running_requests") < n:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def _image(client: openai.OpenAI, steps: int) -> float:
    out = client.images.generate(model=MODEL, prompt="a red cube", size="32x32",
                                 extra_body={"seed": 1, "steps": steps})
    assert out.data[0].b64_json
    return time.monotonic()


def _chat(client: openai.OpenAI, max_tokens: int, started: threading.Event | None = None) -> tuple[float, int]:
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=max_tokens, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True})
    chunks = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content is not None:
            chunks += 1
            if started is not None:
                started.set()
    return time.monotonic(), chunks


def test_a_short_chat_finishes_while_a_long_image_draws(server, client) -> None:
    with ThreadPoolExecutor(2) as pool:
        t0 = time.monotonic()
        image = pool.submit(_image, client, STEPS)
        _wait_running(server, 1)                          # the image is admitted and drawing
        chat_done, chunks = _chat(client, 4)
        assert not image.done()                           # the chat did not wait for the image
        image_done = image.result(timeout=120)
    assert chunks >= 1 and chat_done < image_done
    print(f"chat {chat_done - t0:.2f} s, image {image_done - t0:.2f} s")


def test_an_image_completes_while_chats_keep_streaming(client) -> None:
    started = [threading.Event() for _ in range(3)]
    with ThreadPoolExecutor(4) as pool:
        chats = [pool.submit(_chat, client, 400, ev) for ev in started]
        assert all(ev.wait(60) for ev in started)
        image_done = _image(client, 12)
        ends = [c.result(timeout=120)[0] for c in chats]
    assert image_done < min(ends)                         # drawn between decode steps, not after them
