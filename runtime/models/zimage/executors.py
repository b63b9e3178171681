"""Z-Image on the worker: the text encoder over a batch of prompts, and the denoiser as one Euler step of a
batch of requests, each at its own step of its own schedule (runtime/models/zimage/sampler.py).

The denoiser node runs inside the graph's `repeat: $steps` loop; the conductor batches its Runs across
requests like any node's, so requests that arrived at different times, at different steps, with different
step counts, sizes and prompts share one DiT call (`batch:` in the graph caps it). A request's first step
has no carried latent and starts from its seeded noise.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from mstar_compiler.plan import Node, Plan
from runtime.models.zimage.sampler import Sampling, VAE_DOWNSAMPLE
from runtime.model_executor.parallel.cpu_linear import device_of
from runtime.transport.messages import WorkItem
from runtime.transport.request_params import RequestParams
from runtime.worker.executors import CachelessExecutor, ExecResult

DEFAULT_SIDE = 1024         # diffusers' ZImagePipeline default height and width


def max_side(dit_dims: Mapping[str, Any]) -> int:
    """Largest image side the DiT's RoPE tables hold (its height/width axes count 2x2 patches)."""
    return min(DEFAULT_SIDE * 2, 2 * VAE_DOWNSAMPLE * min(dit_dims["axes_lens"][1:]))


def default_side(dit_dims: Mapping[str, Any]) -> int:
    return min(DEFAULT_SIDE, max_side(dit_dims))


class TextEncoderExecutor(CachelessExecutor):
    """The `zimage_text_encoder` node: every prompt of a batch through one call."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.device = device_of(module)

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]:
        rows = self.module([torch.tensor(item.tokens, dtype=torch.long, device=self.device) for item in items])
        return [ExecResult(outputs={"hidden": r}) for r in rows]


class DenoiseExecutor(CachelessExecutor):
    """The `zimage_dit` node: one denoising step of each request of a batch (module docstring)."""

    def __init__(self, node: Node, module: nn.Module) -> None:
        self.module = module
        self.device = device_of(module)
        self.dtype = next(module.parameters()).dtype
        self.channels = int(node.dims["in_channels"])
        self.side = default_side(node.dims)
        self.sampling: dict[int, Sampling] = {}

    def open(self, request_id: int, params: RequestParams) -> None:
        self.sampling[request_id] = Sampling.from_params(params, self.side)

    def close(self, request_id: int, kv_only: bool) -> None:
        if not kv_only:
            self.sampling.pop(request_id, None)

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]:
        plans = [self.sampling[item.request_id] for item in items]
        latents = []
        for s, ins in zip(plans, inputs):
            latent = ins.get("latent")
            latents.append(s.noise(self.channels) if latent is None or latent.numel() == 0 else latent)
        t = torch.stack([s.timestep(item.step) for s, item in zip(plans, items)]).to(self.device)
        out = self.module([x.to(self.device, self.dtype) for x in latents], t,
                          [ins["caption"].to(self.device, self.dtype) for ins in inputs])
        return [ExecResult(outputs={"latent": s.euler(x.to(self.device), o, item.step)})
                for s, x, o, item in zip(plans, latents, out, items)]


def text_encoder_executor(plan: Plan, node: Node, module: nn.Module, rank: int) -> TextEncoderExecutor:
    return TextEncoderExecutor(module)


def denoise_executor(plan: Plan, node: Node, module: nn.Module, rank: int) -> DenoiseExecutor:
    return DenoiseExecutor(node, module)
