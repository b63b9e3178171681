"""What a served Z-Image request's params mean to the denoiser: its noise, its flow-matching schedule and
one Euler step, as diffusers' ZImagePipeline with its FlowMatchEulerDiscreteScheduler (Z-Image-Turbo's
scheduler config: shift 3, no dynamic shifting) computes them.

`steps` N gives N model calls: sigmas linspace(1, 1/N, N) in fp32, shifted to s*x / (1 + (s-1)*x), then a
final 0. Step i calls the DiT at timestep 1 - sigma_i (Z-Image's convention: 0 is noise) and moves
x <- x + (sigma_{i+1} - sigma_i) * (-output). The noise is (C, H/8, W/8) fp32 standard normal from the
request's seed, as the pipeline draws it from a CPU generator seeded alike.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.transport.request_params import RequestParams

VAE_DOWNSAMPLE = 8          # FLUX VAE: 8 pixels per latent row/column
STRIDE = 16                 # image sides are multiples of this: a latent of whole 2x2 patches


def sigmas(steps: int, shift: float) -> torch.Tensor:
    """The N + 1 noise levels of an N-step schedule (fp32, from 1 down to 0)."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    x = torch.linspace(1.0, 1.0 / steps, steps, dtype=torch.float32)
    x = shift * x / (1 + (shift - 1) * x)
    return torch.cat([x, torch.zeros(1)])


@dataclass(frozen=True)
class Sampling:
    """One request's denoising settings, read from its params."""

    seed: int
    height: int
    width: int
    sigmas: torch.Tensor

    @classmethod
    def from_params(cls, params: RequestParams, default_side: int) -> Sampling:
        """`steps` and `timestep_shift` are graph params; the image API sets the size and the seed (the
        native task endpoint may leave them: the default side, seed 0)."""
        seed = params.sampling.seed
        return cls(seed=0 if seed is None else seed, height=int(params.family.get("height", default_side)),
                   width=int(params.family.get("width", default_side)),
                   sigmas=sigmas(params.count("steps"), params.number("timestep_shift")))

    def noise(self, channels: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed)
        return torch.randn((channels, self.height // VAE_DOWNSAMPLE, self.width // VAE_DOWNSAMPLE),
                           generator=generator)

    def timestep(self, step: int) -> torch.Tensor:
        """The DiT's timestep input at step `step` (fp32, 0-dim): 1 - sigma, as (1000 - 1000 sigma) / 1000."""
        return (1000 - self.sigmas[step] * 1000) / 1000

    def euler(self, latent: torch.Tensor, output: torch.Tensor, step: int) -> torch.Tensor:
        """x one step on from the model's output at it (fp32)."""
        return latent.float() + (self.sigmas[step + 1] - self.sigmas[step]) * -output.float()
