"""Runs BAGEL's weight-light nodes over a batch: ViT, VAE encoder, VAE decoder, CFG step.

Image inputs arrive as the request supplied them, (H, W, 3) uint8 RGB (the server has
applied BAGEL's VAE resize, as BAGEL does to every input image); the ViT resizes further
for its patch grid. Each component is called once per batch with a list of per-request
tensors (they group same-shaped ones themselves). The CFG step reads its (t, t_next)
from the loop counter (`WorkItem.step`) and the request's `steps` / `timestep_shift`,
and its scales from the params its node's `param_args` name; a branch that sent an
empty velocity was not needed at this step (runtime.models.bagel.lm_executor).
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from PIL import Image

from mstar_compiler.plan import Node, Plan
from runtime.models.bagel.generation import Generation, GuidanceUse, vae_resize, vit_resize
from runtime.models.bagel.image_io import ResizePolicy, resize_for
from runtime.model_executor.images import pil_to_tensor
from runtime.models.bagel.cfg_combine import CfgRequest
from runtime.worker.executors import ExecResult, Executor
from runtime.transport.messages import WorkItem
from runtime.transport.request_params import RequestParams
from runtime.model_executor.parallel.cpu_linear import device_of


def lm_dims(plan: Plan) -> Mapping[str, Any]:
    """Dims of the plan's BAGEL LM (image sizes and latent geometry follow from them)."""
    return next(n.dims for n in plan.nodes if n.kind == "bagel_mot_lm")


def image_tensor(image: torch.Tensor, policy: ResizePolicy) -> torch.Tensor:
    """(H, W, 3) uint8 -> (3, h, w) float in [-1, 1], resized by `policy`."""
    pil = Image.fromarray(image.to(torch.uint8).cpu().numpy())
    return pil_to_tensor(resize_for(pil, policy))


class _Stateless(Executor):
    """Nodes without per-request state or KV cache."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.params: dict[int, RequestParams] = {}
        self.device = device_of(module)

    def open(self, request_id: int, params: RequestParams) -> None:
        self.params[request_id] = params

    def close(self, request_id: int, kv_only: bool) -> None:
        if not kv_only:
            self.params.pop(request_id, None)


class ImageEncoderExecutor(_Stateless):
    """`siglip_vit` (-> hidden) or `vae_encoder` (-> latent) over a batch of images."""

    def __init__(self, plan: Plan, node: Node, module: torch.nn.Module) -> None:
        super().__init__(module)
        is_vit = node.kind == "siglip_vit"
        self.policy = vit_resize(node.dims) if is_vit else vae_resize(lm_dims(plan))
        self.port = "hidden" if is_vit else "latent"

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]:
        images = [image_tensor(ins["image"], self.policy).to(self.device) for ins in inputs]
        return [ExecResult(outputs={self.port: out}) for out in self.module(images)]


class VaeDecoderExecutor(_Stateless):
    """`vae_decoder`: final latents -> (3, H, W) images in [-1, 1]."""

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]:
        images = self.module([ins["latent"].to(self.device) for ins in inputs])
        return [ExecResult(outputs={"image": image}) for image in images]


class CfgExecutor(_Stateless):
    """`cfg_combine`: guided Euler steps of a batch of requests at any steps."""

    def __init__(self, plan: Plan, node: Node, module: torch.nn.Module) -> None:
        super().__init__(module)
        self.lm_dims = lm_dims(plan)
        self.param_args = dict(node.param_args)
        self.args = dict(node.args)

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]:
        requests = [self._request(item, ins) for item, ins in zip(items, inputs)]
        return [ExecResult(outputs={"latent": x}) for x in self.module(requests)]

    def _request(self, item: WorkItem, ins: dict[str, torch.Tensor]) -> CfgRequest:
        params = self.params[item.request_id]
        gen = Generation.from_params(params, self.lm_dims)
        t, t_next = gen.step_times(item.step)
        latent = ins.get("latent")
        if latent is None or latent.numel() == 0:    # the first step starts from the request's noise
            latent = gen.noise(self.lm_dims["latent_channels"])

        def velocity(port: str) -> torch.Tensor | None:
            v = ins.get(port)
            return None if v is None or v.numel() == 0 else v.to(self.device)

        use = GuidanceUse.of(self.args, self.param_args, params)
        return CfgRequest(latent.to(self.device), velocity("v_full"), velocity("v_text"), velocity("v_img"),
                          t, t_next, use.text_scale, use.img_scale)
