"""BAGEL's resize of its input images (the tensor conversions are runtime/model_executor/images.py's).

BAGEL resizes every input image so that its long edge is at most `max_size`, its short
edge at least `min_size`, its area at most `max_pixels`, and both sides are multiples of
`stride` (16 for the VAE: 8x VAE downsample x 2x2 latent patches; 14 for the ViT).
"""
from __future__ import annotations

from dataclasses import dataclass

from PIL import Image


@dataclass(frozen=True)
class ResizePolicy:
    """BAGEL's `ImageTransform` sizes for one encoder."""

    max_size: int
    min_size: int
    stride: int
    max_pixels: int = 14 * 14 * 9 * 1024


VAE_RESIZE = ResizePolicy(max_size=1024, min_size=512, stride=16)
VIT_RESIZE = ResizePolicy(max_size=980, min_size=224, stride=14)


def _scaled(width: int, height: int, scale: float, stride: int) -> tuple[int, int]:
    def snap(v: float) -> int:
        return max(stride, int(round(round(v) / stride) * stride))

    return snap(width * scale), snap(height * scale)


def target_size(width: int, height: int, policy: ResizePolicy) -> tuple[int, int]:
    """(width, height) after BAGEL's MaxLongEdgeMinShortEdgeResize."""
    scale = min(policy.max_size / max(width, height), 1.0)
    scale = max(scale, policy.min_size / min(width, height))
    w, h = _scaled(width, height, scale, policy.stride)
    if w * h > policy.max_pixels:
        w, h = _scaled(w, h, policy.max_pixels / (w * h), policy.stride)
    if max(w, h) > policy.max_size:
        w, h = _scaled(w, h, policy.max_size / max(w, h), policy.stride)
    return w, h


def resize_for(image: Image.Image, policy: ResizePolicy) -> Image.Image:
    """RGB copy of `image` resized (bicubic) to `target_size`."""
    image = image.convert("RGB")
    size = target_size(image.width, image.height, policy)
    return image if size == image.size else image.resize(size, Image.BICUBIC)
