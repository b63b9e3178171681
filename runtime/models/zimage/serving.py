"""What Z-Image adds to the server (runtime/entrypoints/http/families.py): its answer to OpenAI's image
generation endpoint over its t2i task (it does not edit), and the page's image panel.

The prompt is written as diffusers' ZImagePipeline writes it, one user turn of Qwen3's chat template with
the generation prompt after it (`enable_thinking=True` adds nothing more), and must fit the pipeline's
512 tokens (`max_sequence_length`): a longer one is refused, where the pipeline would cut it. Body
fields set the plan's params (`steps`, `timestep_shift`) and `seed`; `num_inference_steps` is diffusers'
name for steps. Turbo is distilled to run without classifier-free guidance: a `guidance_scale` other than
0 is refused, not ignored.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from mstar_compiler.plan import Plan
from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.families import FamilyServing, ServedModel
from runtime.models.zimage.executors import default_side, max_side
from runtime.models.zimage.sampler import STRIDE

TEMPLATE = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


@dataclass(frozen=True)
class ZImageDrawer:
    dit_dims: Mapping[str, Any]
    max_tokens: int
    generate_task: str = "t2i"
    edit_task: str = ""
    aliases: Mapping[str, str] = field(default_factory=lambda: {"num_inference_steps": "steps"})
    mask_refusal: str = "Z-Image-Turbo draws from text only"

    def default_size(self) -> tuple[int, int]:
        side = default_side(self.dit_dims)
        return side, side

    def size_problem(self, width: int, height: int) -> str | None:
        side = max_side(self.dit_dims)
        for name, value in (("width", width), ("height", height)):
            if value < STRIDE or value > side or value % STRIDE:
                return f"{name} {value} must be a multiple of {STRIDE} between {STRIDE} and {side}"
        return None

    def task_defaults(self, task: str) -> Mapping[str, Any]:
        return {}

    def prompt_ids(self, server: ServedModel, prompt: str) -> list[int]:
        ids = server.tokenizer.encode(TEMPLATE.format(prompt), add_special_tokens=False)
        if len(ids) > self.max_tokens:
            raise ApiError(400, f"'prompt' is {len(ids)} tokens in Z-Image's chat template; the text encoder "
                                f"reads at most {self.max_tokens}", "prompt", "prompt_too_long")
        return ids

    def check_fields(self, fields: Mapping[str, Any]) -> None:
        guidance = fields.get("guidance_scale")
        if guidance is not None and _number(guidance) != 0.0:
            raise ApiError(400, f"'guidance_scale' must be 0: Z-Image-Turbo is distilled to draw without "
                                f"classifier-free guidance, got {guidance!r}", "guidance_scale")


def _number(value: Any) -> float | None:
    """A body field as a number (form fields arrive as strings); None when it is none."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _drawer(plan: Plan) -> ZImageDrawer | None:
    dit = next((n.dims for n in plan.nodes if n.kind == "zimage_dit"), None)
    encoder = next((n.dims for n in plan.nodes if n.kind == "zimage_text_encoder"), None)
    if dit is None or encoder is None or "t2i" not in {t.name for t in plan.tasks}:
        return None
    return ZImageDrawer(dit, int(encoder["max_sequence_length"]))


def _playground(plan: Plan) -> dict[str, Any]:
    drawer = _drawer(plan)
    return {} if drawer is None else {"images": {"edit": False, "max_side": max_side(drawer.dit_dims),
                                                 "stride": STRIDE}}


SERVING = FamilyServing(frozenset({"zimage_dit"}), playground=_playground, drawer=_drawer)
