"""Image edits of one picture, one after another, timed end to end (the prefix suite's (c)).

Each edit is one OpenAI `POST /v1/images/edits` (multipart: the PNG, a prompt, n = 1, b64 PNG
back) with its own prompt and a fixed seed; the next is sent when one returns. Time to image
runs from the send to the full response.
"""
from __future__ import annotations

import io
import time

import numpy as np
import openai
from PIL import Image


def smooth_png(size: int, seed: int) -> bytes:
    """A PNG of smooth random colours, `size` x `size`: each seed its own picture."""
    small = np.random.default_rng(seed).integers(0, 256, (4, 4, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(small).resize((size, size), Image.BILINEAR).save(buf, format="PNG")
    return buf.getvalue()


def edits_of_one_image(url: str, model: str, image: bytes, prompts: list[str], extra: dict) -> dict[str, float]:
    """Edit `image` with each prompt in turn: time to image of the first edit, and the mean of the rest."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=1800)
    times = []
    for prompt in prompts:
        start = time.perf_counter()
        out = client.images.edit(model=model, image=("in.png", image, "image/png"), prompt=prompt,
                                 response_format="b64_json", extra_body=extra)
        if not out.data or not out.data[0].b64_json:
            raise RuntimeError(f"{url}: an edit returned no image")
        times.append(time.perf_counter() - start)
    return {"first_edit_s": times[0], "later_edit_s": sum(times[1:]) / len(times[1:])}
