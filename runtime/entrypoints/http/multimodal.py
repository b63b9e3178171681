"""Images in requests: decoding them into request input items, and chats that carry them.

An image input item is ("image", (H, W, 3) uint8 RGB tensor), prepared first as the plan's
model family takes input images (`FamilyServing.prepare_image`: BAGEL resizes every input
image with its VAE transform, so the server knows an I2I request's output size). A chat
message whose content has `image_url` parts (data URLs; the server never fetches) becomes
interleaved input items, text parts as plain token ids, and runs the plan's `i2t` task.
"""
from __future__ import annotations

import base64
import binascii
import io
import warnings
from typing import Any, Iterable

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from mstar_compiler.plan import Plan
from runtime.conductor.request import SizedInput
from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.families import families_of

IMAGE_TASK = "i2t"
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP")   # what PIL may open; nothing that runs a helper program
MAX_IMAGE_PIXELS = 1 << 27                # ~134 MP per image, checked before decoding
MAX_IMAGES_PER_REQUEST = 16
# PIL's own bomb check (a warning past its limit, which decode_image makes an error) must agree:
# its default, ~89 MP, would refuse images under ours with a message naming a limit we do not state
Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS


def decode_image(data: bytes, field: str, max_pixels: int = MAX_IMAGE_PIXELS, limit: str = "") -> Image.Image:
    """PNG, JPEG or WebP bytes -> RGB image; 400 for any other format (PIL would open EPS through
    Ghostscript), for more than `max_pixels` (at most MAX_IMAGE_PIXELS; read from the header, before
    decoding: a decompression bomb never allocates; `limit` names the graph param that set it) and
    for anything that does not decode."""
    max_pixels = min(max_pixels, MAX_IMAGE_PIXELS)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
            if image.width * image.height > max_pixels:
                why = f" (param {limit})" if limit else ""
                raise ApiError(400, f"{field}: {image.width}x{image.height} is more than this model's limit of "
                                    f"{max_pixels} pixels{why}; send a smaller picture", field, "image_too_large")
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError,
            Image.DecompressionBombWarning) as exc:
        raise ApiError(400, f"{field}: not a decodable {'/'.join(IMAGE_FORMATS)} image ({exc})", field) from None


def image_item(plan: Plan, data: bytes, field: str) -> torch.Tensor:
    """Encoded image bytes -> (H, W, 3) uint8 tensor, prepared as the plan's family takes images; 400 if
    not an image. Decoding is CPU work: handlers call this off the event loop (asyncio.to_thread)."""
    image = decode_image(data, field)
    for family in families_of(plan):
        if family.prepare_image is not None:
            image = family.prepare_image(plan, image)
    return torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.uint8).copy())


def image_input(plan: Plan, image: torch.Tensor) -> Any:
    """A prepared image as a request input item's value: with the rows its encoders compute when the family
    says (SizedInput), else the tensor itself."""
    for family in families_of(plan):
        if family.image_rows is not None:
            return SizedInput(image, family.image_rows(plan, image))
    return image


def data_url_bytes(url: Any, field: str) -> bytes:
    """The bytes of a base64 `data:` URL; 400 for anything else (no fetching)."""
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
        raise ApiError(400, f"{field}: only base64 data URLs (data:image/png;base64,...) are accepted", field)
    try:
        return base64.b64decode(url.split(";base64,", 1)[1], validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, f"{field}: the data URL is not valid base64", field) from None


def has_image_parts(contents: Iterable[Any]) -> bool:
    """Whether the contents of a chat's messages carry image parts."""
    return any(isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "image_url" for p in content)
               for content in contents)


def _part_item(plan: Plan, tokenizer: Any, part: Any, field: str) -> tuple[str, Any]:
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return "text", tokenizer.encode(part["text"], add_special_tokens=False)
    if isinstance(part, dict) and part.get("type") == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        return "image", image_input(plan, image_item(plan, data_url_bytes(url, field), field))
    raise ApiError(400, f"{field}: a content part must be {{'type': 'text'}} or {{'type': 'image_url'}}", field)


def image_chat_items(messages: list[dict], plan: Plan, tokenizer: Any) -> list[tuple[str, Any]] | None:
    """Interleaved input items of a chat with images (every part in message order), None when text only."""
    if not has_image_parts(m["content"] for m in messages):
        return None
    if IMAGE_TASK not in {t.name for t in plan.tasks}:
        raise ApiError(400, f"the model '{plan.model}' does not take image inputs", "messages")
    num_images = sum(1 for m in messages if isinstance(m["content"], list)
                     for p in m["content"] if isinstance(p, dict) and p.get("type") == "image_url")
    if num_images > MAX_IMAGES_PER_REQUEST:
        raise ApiError(400, f"at most {MAX_IMAGES_PER_REQUEST} images per request, got {num_images}", "messages")
    items: list[tuple[str, Any]] = []
    for i, message in enumerate(messages):
        content = message["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        items += [_part_item(plan, tokenizer, part, f"messages[{i}].content[{j}]") for j, part in enumerate(parts)]
    return items
