"""Images between tensors and files: (3, H, W) float in [-1, 1] <-> RGB pixels, PNG bytes.

The model side's convention for every family that reads or draws images (BAGEL, Z-Image); rounding as
diffusers' image processor rounds (x / 2 + 0.5, clamped, times 255, rounded).
"""
from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image


def pil_to_tensor(image: Image.Image) -> torch.Tensor:
    """RGB PIL image -> (3, H, W) float32 in [-1, 1] (mean 0.5 / std 0.5 normalise)."""
    pixels = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0  # (H, W, 3)
    return torch.from_numpy(pixels).permute(2, 0, 1).mul(2.0).sub(1.0).contiguous()


def tensor_to_pil(image: torch.Tensor) -> Image.Image:
    """(3, H, W) in [-1, 1] -> RGB PIL image (clamped; rounded, where BAGEL's own code truncates)."""
    pixels = ((image.detach().float().cpu() * 0.5 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8)
    return Image.fromarray(pixels.permute(1, 2, 0).numpy())


def png_bytes(image: torch.Tensor) -> bytes:
    """(3, H, W) in [-1, 1] -> PNG file bytes."""
    buffer = io.BytesIO()
    tensor_to_pil(image).save(buffer, format="PNG")
    return buffer.getvalue()
