"""Component `cfg_combine`: BAGEL's classifier-free guidance and Euler step, no weights.

Per request: three velocities (full condition, text dropped, image dropped) of the same
latent, the latent x_t and the step's times (t, t_next) -> x_next. The combine, renorm
and Euler update are one fused Triton kernel on CUDA (`runtime.models.bagel.cfg_kernel`), its torch
reference on CPU. Node args give the defaults; a request may override the scales and the
interval (request params `cfg_text_scale`, `cfg_img_scale`, `cfg_interval`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from runtime.models.bagel.cfg_kernel import RENORM_TYPES, Guidance, cfg_euler_step


@dataclass(frozen=True)
class CfgRequest:
    """One request's inputs to a guided Euler step."""

    latent: torch.Tensor                  # x_t (C, h, w), the loop-carried latent (fp32)
    v_full: torch.Tensor                  # velocity with every condition (C, h, w)
    v_text: torch.Tensor | None           # velocity with the text dropped; None: no guidance
    v_img: torch.Tensor | None            # velocity with the input image(s) dropped; None: no image guidance
    timestep: float                       # t of x_t
    timestep_next: float                  # t of the step's result
    text_scale: float                     # the request's cfg_text_scale (or the node's constant arg)
    img_scale: float                      # the request's cfg_img_scale (or the node's constant arg)
    cfg_interval: tuple[float, float] | None = None   # None: the node's arg


class CfgCombine(nn.Module):
    """Guided Euler steps for a batch of requests (grouped into same-shaped kernel launches)."""
    kind = "cfg_combine"

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any]) -> None:
        super().__init__()
        self.patch = dims["latent_patch_size"]
        self.renorm_type = str(args["renorm_type"])
        self.renorm_min = float(args["renorm_min"])
        self.cfg_interval = tuple(float(x) for x in args["cfg_interval"])
        if self.renorm_type not in RENORM_TYPES:
            raise ValueError(f"cfg_combine: renorm_type {self.renorm_type!r} is not one of {RENORM_TYPES}")

    def _guidance(self, group: Sequence[CfgRequest], device: torch.device) -> Guidance:
        def column(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        intervals = [r.cfg_interval or self.cfg_interval for r in group]
        return Guidance(
            text_scale=column([r.text_scale for r in group]), img_scale=column([r.img_scale for r in group]),
            interval_lo=column([lo for lo, _ in intervals]), interval_hi=column([hi for _, hi in intervals]))

    def _step(self, group: Sequence[CfgRequest]) -> torch.Tensor:
        device = group[0].latent.device

        def stack(name: str) -> torch.Tensor | None:
            values = [getattr(r, name) for r in group]
            return None if values[0] is None else torch.stack(values)

        times = torch.tensor([[r.timestep, r.timestep_next] for r in group], dtype=torch.float32, device=device)
        return cfg_euler_step(stack("latent"), stack("v_full"), stack("v_text"), stack("v_img"),
                              times[:, 0], times[:, 1], self._guidance(group, device),
                              renorm_type=self.renorm_type, renorm_min=self.renorm_min, patch_size=self.patch)

    @torch.inference_mode()
    def forward(self, requests: Sequence[CfgRequest]) -> list[torch.Tensor]:
        """x_next (C, h, w) per request, in request order."""
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            key = (tuple(r.latent.shape), r.v_text is not None, r.v_img is not None)
            groups.setdefault(key, []).append(i)
        out: list[torch.Tensor] = [torch.empty(0)] * len(requests)
        for indices in groups.values():
            for i, x_next in zip(indices, self._step([requests[i] for i in indices])):
                out[i] = x_next
        return out
