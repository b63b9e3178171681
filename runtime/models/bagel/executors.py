"""The executors of BAGEL's kinds (named in its `Family`, mstar_compiler/catalogue/bagel.py), and the one
engine its same_as LM nodes share per rank."""
from __future__ import annotations

import weakref

import torch

from mstar_compiler.plan import Node, Plan
from runtime.models.bagel.lm_executor import BagelLMEngine, BagelLMExecutor
from runtime.models.bagel.node_executors import CfgExecutor, ImageEncoderExecutor, VaeDecoderExecutor

# module -> its engine: nodes sharing weights on a rank share one module (runtime.worker.loader)
_ENGINES: weakref.WeakKeyDictionary[torch.nn.Module, BagelLMEngine] = weakref.WeakKeyDictionary()


def bagel_lm_executor(plan: Plan, node: Node, module: torch.nn.Module, rank: int) -> BagelLMExecutor:
    engine = _ENGINES.get(module)
    if engine is None:
        engine = _ENGINES[module] = BagelLMEngine(plan, module, rank, node.weight_key)
    return BagelLMExecutor(plan, node, engine, rank)


def image_encoder_executor(plan: Plan, node: Node, module: torch.nn.Module, rank: int) -> ImageEncoderExecutor:
    return ImageEncoderExecutor(plan, node, module)


def vae_decoder_executor(plan: Plan, node: Node, module: torch.nn.Module, rank: int) -> VaeDecoderExecutor:
    return VaeDecoderExecutor(module)


def cfg_executor(plan: Plan, node: Node, module: torch.nn.Module, rank: int) -> CfgExecutor:
    return CfgExecutor(plan, node, module)
