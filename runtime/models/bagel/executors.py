"""The executors of BAGEL's kinds (registered by name), and the one engine its same_as LM
nodes share per rank."""
from __future__ import annotations

import weakref

import torch

from mstar_compiler.plan import Node, Plan
from runtime.worker.executors import register_executor
from runtime.models.bagel.lm_executor import BagelLMEngine, BagelLMExecutor
from runtime.models.bagel.node_executors import CfgExecutor, ImageEncoderExecutor, VaeDecoderExecutor

# module -> its engine: nodes sharing weights on a rank share one module (runtime.worker.loader)
_ENGINES: weakref.WeakKeyDictionary[torch.nn.Module, BagelLMEngine] = weakref.WeakKeyDictionary()


@register_executor("bagel_mot_lm")
def bagel_lm_executor(plan: Plan, node: Node, module: torch.nn.Module, rank: int) -> BagelLMExecutor:
    engine = _ENGINES.get(module)
    if engine is None:
        engine = _ENGINES[module] = BagelLMEngine(plan, module, rank, node.weight_key)
    return BagelLMExecutor(plan, node, engine, rank)


@register_executor("bagel_image_encoder")
def image_encoder_executor(plan: Plan, node: Node, module: torch.nn.Module, rank: int) -> ImageEncoderExecutor:
    return ImageEncoderExecutor(plan, node, module)


@register_executor("vae_decoder")
def vae_decoder_executor(plan: Plan, node: Node, module: torch.nn.Module, rank: int) -> VaeDecoderExecutor:
    return VaeDecoderExecutor(module)


@register_executor("cfg_combine")
def cfg_executor(plan: Plan, node: Node, module: torch.nn.Module, rank: int) -> CfgExecutor:
    return CfgExecutor(plan, node, module)
