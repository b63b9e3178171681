"""What BAGEL adds to the server (runtime/entrypoints/http/families.py): OpenAI's image endpoints over its
t2i / i2i tasks, its resize of every input image and the rows its encoders compute from one, and the page's
image panel."""
from __future__ import annotations

from typing import Any

import torch
from aiohttp import web
from PIL import Image

from mstar_compiler.plan import Plan
from runtime.models.bagel.generation import image_stride, max_image_side, vae_resize, vit_resize
from runtime.models.bagel.image_io import resize_for, target_size
from runtime.models.bagel.images_api import bagel_lm_dims, images_edits, images_generations
from runtime.entrypoints.http.families import FamilyServing


def _install(app: web.Application) -> None:
    app.router.add_post("/v1/images/generations", images_generations)
    app.router.add_post("/v1/images/edits", images_edits)


def _prepare_image(plan: Plan, image: Image.Image) -> Image.Image:
    """BAGEL resizes every input image with its VAE transform (the ViT resizes further on its rank)."""
    return resize_for(image, vae_resize(bagel_lm_dims(plan)))


def _image_rows(plan: Plan, image: torch.Tensor) -> int:
    """The most rows an encoder computes from a prepared (H, W, 3) image: the ViT's patches after its own
    resize, or the VAE's latent tokens (the image is at the VAE's size already)."""
    height, width, stride = image.shape[0], image.shape[1], image_stride(bagel_lm_dims(plan))
    rows = (height // stride) * (width // stride)
    vit = next((n.dims for n in plan.nodes if n.kind == "siglip_vit"), None)
    if vit is not None:
        w, h = target_size(width, height, vit_resize(vit))
        rows = max(rows, (w // vit["patch_size"]) * (h // vit["patch_size"]))
    return rows


def _playground(plan: Plan) -> dict[str, Any]:
    lm, tasks = bagel_lm_dims(plan), {t.name for t in plan.tasks}
    if "t2i" not in tasks:
        return {}
    return {"images": {"edit": "i2i" in tasks, "max_side": max_image_side(lm), "stride": image_stride(lm)}}


SERVING = FamilyServing(frozenset({"bagel_mot_lm"}), install=_install,
                        playground=_playground, prepare_image=_prepare_image, image_rows=_image_rows)
