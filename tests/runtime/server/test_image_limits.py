"""Image inputs are decoded only as PNG, JPEG or WebP and never past MAX_IMAGE_PIXELS: a
decompression bomb (a tiny file whose header names a huge image), EPS and GIF are 400s."""
from __future__ import annotations

import io
import struct
import zlib

import pytest
from PIL import Image

from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.multimodal import MAX_IMAGE_PIXELS, decode_image


def encoded(fmt: str, size: tuple[int, int] = (8, 6)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 10, 30)).save(buf, format=fmt)
    return buf.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    """A valid small PNG whose IHDR is rewritten to name width x height (CRC fixed up)."""
    data = bytearray(encoded("PNG"))
    ihdr = struct.pack(">II", width, height) + bytes(data[24:29])
    data[16:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return bytes(data)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_allowed_formats_decode(fmt) -> None:
    image = decode_image(encoded(fmt), "image")
    assert image.size == (8, 6) and image.mode == "RGB"


@pytest.mark.parametrize("data", [
    encoded("GIF"),
    b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n",
    png_claiming(20000, 20000),
    b"\x89PNG\r\n\x1a\n garbage",
], ids=["gif", "eps", "bomb", "broken"])
def test_other_images_are_a_400(data) -> None:
    with pytest.raises(ApiError) as err:
        decode_image(data, "messages[0].content[1]")
    assert err.value.status == 400 and err.value.param == "messages[0].content[1]"


def test_the_bomb_is_refused_from_its_header() -> None:
    bomb = png_claiming(20000, 20000)
    assert len(bomb) < 200 and 20000 * 20000 > MAX_IMAGE_PIXELS
    with pytest.raises(ApiError, match="pixels"):
        decode_image(bomb, "image")


def test_the_limit_is_ours_not_pils() -> None:
    """100 MP is under MAX_IMAGE_PIXELS but over PIL's default bomb limit (~89 MP): the header
    passes, and this truncated file fails as truncated, not as a decompression bomb."""
    assert Image.MAX_IMAGE_PIXELS == MAX_IMAGE_PIXELS and 10_000 * 10_000 < MAX_IMAGE_PIXELS
    with pytest.raises(ApiError) as err:
        decode_image(png_claiming(10_000, 10_000), "image")
    assert "truncated" in str(err.value) and "bomb" not in str(err.value), err.value
