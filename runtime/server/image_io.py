"""Images that arrive in requests: encoded bytes -> PIL images (what every handler decodes with)."""
from __future__ import annotations

import io

from PIL import Image


def image_from_bytes(data: bytes) -> Image.Image:
    """An encoded image (PNG, JPEG, ...) -> RGB PIL image."""
    return Image.open(io.BytesIO(data)).convert("RGB")
