"""Weights of BAGEL's plain-module components (`siglip_vit`, `vae_encoder`, `vae_decoder`).

Their parameters carry checkpoint names as they are (`vit_model.vision_model...`,
`encoder.down_blocks...`), so loading is a name-for-name copy: `load_matching` reads a
safetensors file or directory of exactly this module's tensors and reports every missing,
unexpected or mis-shaped one. Which tensors of BAGEL's combined `ema.safetensors` are whose,
and how `ae.safetensors`' FLUX names become these, is the graph's `weights:` mapping
(`runtime.model_executor.weights`), not this module's. Without weights a component draws its initial
parameters under `seeded(seed)`.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator, Mapping

import torch
from torch import nn

from runtime.model_executor.weights import WeightLoadError, iter_safetensors

log = logging.getLogger(__name__)


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Deterministic parameter initialisation inside, the caller's RNG state untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def load_matching(module: nn.Module, path: str, fixed: tuple[str, ...] = ()) -> None:
    """Copy every checkpoint tensor into `module`'s of that name; `fixed` names may be absent."""
    own: Mapping[str, torch.Tensor] = module.state_dict()
    seen, unexpected, misshaped = set(), [], []
    with torch.no_grad():
        for name, tensor in iter_safetensors(path):
            target = own.get(name)
            if target is None:
                unexpected.append(name)
                continue
            if tuple(tensor.shape) != tuple(target.shape):
                misshaped.append(f"{name} {tuple(tensor.shape)} != expected {tuple(target.shape)}")
                continue
            target.copy_(tensor)
            seen.add(name)
    missing = sorted(set(own) - seen - set(fixed) - {m.split(" ")[0] for m in misshaped})
    if missing or unexpected or misshaped:
        raise WeightLoadError(missing, sorted(unexpected), misshaped)
    log.info("loaded %d tensors of %s from %s", len(seen), type(module).__name__, path)


def init_weights(module: nn.Module, args: Mapping, fixed: tuple[str, ...] = ()) -> None:
    """Load `args["weights"]` when given; otherwise say that the weights are random."""
    if args.get("weights"):
        load_matching(module, args["weights"], fixed)
    else:
        log.debug("%s: initialised with seed %d (the loader reports whether weights replace it)", type(module).__name__, args.get("seed", 0))
