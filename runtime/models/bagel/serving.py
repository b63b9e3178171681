"""What BAGEL adds to the server (runtime/entrypoints/http/families.py): its answer to OpenAI's image endpoints
over its t2i / i2i tasks, its resize of every input image and the rows its encoders compute from one, and the
page's image panel."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from PIL import Image

from mstar_compiler.plan import Plan
from runtime.models.bagel.generation import check_image_size, image_stride, max_image_side, vae_resize
from runtime.models.bagel.image_io import resize_for
from runtime.models.bagel.row_keys import encoder_rows
from runtime.entrypoints.http.families import FamilyServing, ServedModel


def bagel_lm_dims(plan: Plan) -> Mapping[str, Any] | None:
    """Dims of the plan's BAGEL LM, None for other models."""
    return next((n.dims for n in plan.nodes if n.kind == "bagel_mot_lm"), None)


@dataclass(frozen=True)
class BagelDrawer:
    """BAGEL's image generation and edits. Its params are body fields (`steps`, `cfg_text_scale`, `cfg_img_scale`,
    `timestep_shift`; `guidance_scale` means cfg_text_scale and `image_guidance_scale` cfg_img_scale). Without an
    image to guide by, its T2I uses cfg_img_scale 1 (the image-dropped branch is skipped)."""

    lm_dims: Mapping[str, Any]
    generate_task: str = "t2i"
    edit_task: str = "i2i"
    aliases: Mapping[str, str] = field(default_factory=lambda: {
        "guidance_scale": "cfg_text_scale", "guidance": "cfg_text_scale", "image_guidance_scale": "cfg_img_scale"})
    mask_refusal: str = "BAGEL edits the whole image by the prompt"

    def default_size(self) -> tuple[int, int]:
        side = max_image_side(self.lm_dims)
        return side, side

    def size_problem(self, width: int, height: int) -> str | None:
        return check_image_size(width, height, self.lm_dims)

    def task_defaults(self, task: str) -> Mapping[str, Any]:
        return {"cfg_img_scale": 1.0} if task == self.generate_task else {}

    def prompt_ids(self, server: ServedModel, prompt: str) -> list[int]:
        return server.tokenizer.encode(prompt, add_special_tokens=False)

    def check_fields(self, fields: Mapping[str, Any]) -> None:
        """Every field BAGEL takes is a plan param."""


def _drawer(plan: Plan) -> BagelDrawer | None:
    dims = bagel_lm_dims(plan)
    return None if dims is None else BagelDrawer(dims)


def _prepare_image(plan: Plan, image: Image.Image) -> Image.Image:
    """BAGEL resizes every input image with its VAE transform (the ViT resizes further on its rank)."""
    return resize_for(image, vae_resize(bagel_lm_dims(plan)))


def _image_rows(plan: Plan, image: torch.Tensor) -> int:
    """The most rows an encoder computes from a prepared (H, W, 3) image: the ViT's patches after its own
    resize, or the VAE's latent tokens."""
    return max(encoder_rows(plan, image.shape[0], image.shape[1]).values())


def _playground(plan: Plan) -> dict[str, Any]:
    lm, tasks = bagel_lm_dims(plan), {t.name for t in plan.tasks}
    if "t2i" not in tasks:
        return {}
    return {"images": {"edit": "i2i" in tasks, "max_side": max_image_side(lm), "stride": image_stride(lm)}}


SERVING = FamilyServing(frozenset({"bagel_mot_lm"}), playground=_playground, prepare_image=_prepare_image,
                        image_rows=_image_rows, drawer=_drawer)
