"""The executors of BAGEL's kinds, and the one engine its same_as LM nodes share per rank.

`bagel_executor(plan, node, module, rank)` is what `executor_for` asks first; it answers
None for kinds that are not BAGEL's.
"""
from __future__ import annotations

import weakref

import torch

from mstar_compiler.plan import Node, Plan
from runtime.executors.bagel_lm import BagelLMEngine, BagelLMExecutor
from runtime.executors.bagel_nodes import CfgExecutor, ImageEncoderExecutor, VaeDecoderExecutor

# module -> its engine: nodes sharing weights on a rank share one module (runtime.worker.loader)
_ENGINES: weakref.WeakKeyDictionary[torch.nn.Module, BagelLMEngine] = weakref.WeakKeyDictionary()


def bagel_executor(plan: Plan, node: Node, module: torch.nn.Module, rank: int):
    """The executor of a BAGEL node, or None when `node` is of another family."""
    if node.kind == "bagel_mot_lm":
        engine = _ENGINES.get(module)
        if engine is None:
            engine = _ENGINES[module] = BagelLMEngine(plan, module, rank, node.weight_key)
        return BagelLMExecutor(plan, node, engine, rank)
    if node.kind in ("siglip_vit", "vae_encoder"):
        return ImageEncoderExecutor(plan, node, module)
    if node.kind == "vae_decoder":
        return VaeDecoderExecutor(module)
    if node.kind == "cfg_combine":
        return CfgExecutor(plan, node, module)
    return None
