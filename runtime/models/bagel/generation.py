"""What a served BAGEL request's params mean to the ranks that run it.

Every rank that runs part of a generation request derives the same values from the
request's params alone, so the CFG branches of a `cfg_parallel` placement need no extra
messages: the initial noise is drawn from `seed` on each rank, a Loop's counter gives
the Euler step's (t, t_next) through `steps` and `timestep_shift`, and whether a CFG
branch is needed at a step follows from the guidance scales and interval.

Image sizes scale with the model's dims: the published model takes VAE images up to
1024 px a side and ViT images up to 980 px; a tiny preset takes what its position
tables hold (8 x latent patch x max_latent_size, patch x max_num_patch_per_side).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from runtime.models.bagel.flow import flow_step_times
from runtime.models.bagel.image_io import VAE_RESIZE, VIT_RESIZE, ResizePolicy
from runtime.transport.request_params import RequestParams

VAE_DOWNSAMPLE = 8          # FLUX VAE: 8 pixels per latent row/column


def max_image_side(lm_dims: Mapping[str, Any]) -> int:
    """Largest image side the LM's latent position table holds (1024 for BAGEL-7B)."""
    return min(VAE_RESIZE.max_size, VAE_DOWNSAMPLE * lm_dims["latent_patch_size"] * lm_dims["max_latent_size"])


def image_stride(lm_dims: Mapping[str, Any]) -> int:
    """Generated and VAE-encoded image sides are multiples of this (16 for BAGEL)."""
    return VAE_DOWNSAMPLE * lm_dims["latent_patch_size"]


def vae_resize(lm_dims: Mapping[str, Any]) -> ResizePolicy:
    """BAGEL's VAE resize, capped by what the LM's latent grid holds."""
    side = max_image_side(lm_dims)
    return ResizePolicy(max_size=side, min_size=min(VAE_RESIZE.min_size, side // 2), stride=image_stride(lm_dims))


def vit_resize(vit_dims: Mapping[str, Any]) -> ResizePolicy:
    """BAGEL's ViT resize, capped by the ViT's position table."""
    side = min(VIT_RESIZE.max_size, vit_dims["patch_size"] * vit_dims["max_num_patch_per_side"])
    return ResizePolicy(max_size=side, min_size=min(VIT_RESIZE.min_size, side), stride=vit_dims["patch_size"])


def check_image_size(width: int, height: int, lm_dims: Mapping[str, Any]) -> str | None:
    """Why a generated image cannot be width x height, or None when it can."""
    side, stride = max_image_side(lm_dims), image_stride(lm_dims)
    for name, value in (("width", width), ("height", height)):
        if value < stride or value > side or value % stride:
            return f"{name} {value} must be a multiple of {stride} between {stride} and {side}"
    return None


@dataclass(frozen=True)
class Generation:
    """One request's generation settings, read from its params."""

    seed: int
    height: int             # output image pixels
    width: int
    steps: int              # N flow timesteps: N - 1 Euler steps
    shift: float            # BAGEL's timestep shift

    @classmethod
    def from_params(cls, params: RequestParams, lm_dims: Mapping[str, Any]) -> Generation:
        """`steps` and `timestep_shift` are graph params; the image API sets the size (the native
        task endpoint leaves it: the largest the LM holds) and the seed (unseeded draws from 0)."""
        side = max_image_side(lm_dims)
        seed = params.sampling.seed
        return cls(seed=0 if seed is None else seed, height=int(params.family.get("height", side)),
                   width=int(params.family.get("width", side)), steps=params.count("steps"),
                   shift=params.number("timestep_shift"))

    def noise(self, channels: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """x at t = 1: (channels, H/8, W/8) float32 standard normal from `seed` (same on every rank)."""
        generator = torch.Generator().manual_seed(self.seed)
        shape = (channels, self.height // VAE_DOWNSAMPLE, self.width // VAE_DOWNSAMPLE)
        return torch.randn(shape, generator=generator).to(device)

    def step_times(self, step: int) -> tuple[float, float]:
        """(t, t_next) of Euler step `step` (the draw loop's counter)."""
        return flow_step_times(self.steps, self.shift, step)


@dataclass(frozen=True)
class GuidanceUse:
    """Which CFG branches change the result of a step (`runtime.models.bagel.cfg_kernel`'s rules)."""

    text_scale: float
    img_scale: float
    interval: tuple[float, float]

    @classmethod
    def of(cls, cfg_args: Mapping[str, Any], param_args: Mapping[str, str], params: RequestParams) -> GuidanceUse:
        """From the cfg node's args, overridden by the request params its `param_args` name."""
        def value(arg: str) -> float:
            param = param_args.get(arg)
            return params.number(param) if param is not None else float(cfg_args[arg])

        lo, hi = cfg_args["cfg_interval"]
        return cls(value("text_scale"), value("img_scale"), (float(lo), float(hi)))

    def uses_text(self, t: float) -> bool:
        return self.interval[0] < t <= self.interval[1] and self.text_scale > 1.0

    def uses_img(self, t: float) -> bool:
        return self.uses_text(t) and self.img_scale > 1.0
