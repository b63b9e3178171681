"""Loading HF-named tensors into a module, with a key-by-key check, or seeded random ones.

A module describes the checkpoint it reads as *slots*: HF tensor name -> (full shape,
loader). The loader copies this rank's part of the full tensor into the module (fusing
q/k/v or gate/up, slicing a tensor-parallel shard), so names and shapes stay those of
the published checkpoint whatever the module stores.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping

import torch
from torch import nn

log = logging.getLogger(__name__)

# set while a module is built only to be filled from a checkpoint (see `checkpoint_follows`)
_CHECKPOINT_FOLLOWS: ContextVar[bool] = ContextVar("checkpoint_follows", default=False)
# checkpoint entries that are derived buffers, not weights
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass(frozen=True)
class Slot:
    """Where one HF checkpoint tensor goes."""

    shape: tuple[int, ...]                    # full (unsharded) shape in the checkpoint
    load: Callable[[torch.Tensor], None]      # copies the tensor (or this rank's part) into place
    is_norm: bool = False                     # random init: ones instead of noise
    target: torch.Tensor | None = None        # the parameter itself, where the slot is one whole parameter


class WeightLoadError(ValueError):
    """The checkpoint does not match the module: lists every missing, unexpected, mis-shaped key."""

    def __init__(self, missing: list[str], unexpected: list[str], misshaped: list[str]) -> None:
        lines = ["checkpoint does not match the model:"]
        for title, names in (("missing", missing), ("unexpected", unexpected), ("wrong shape", misshaped)):
            if names:
                more = " ..." if len(names) > 20 else ""
                lines.append(f"  {title} ({len(names)}): " + ", ".join(names[:20]) + more)
        super().__init__("\n".join(lines))
        self.missing, self.unexpected, self.misshaped = missing, unexpected, misshaped


def load_into(slots: Mapping[str, Slot], tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
              optional: Iterable[str] = ()) -> None:
    """Check every name and shape, then load; raises WeightLoadError listing all problems.

    `tensors` may be a mapping or a lazy stream of (name, tensor) pairs (a large checkpoint
    read file by file); `optional` names may be present and are then ignored (e.g. a
    tied `lm_head.weight`).
    """
    items = tensors.items() if isinstance(tensors, Mapping) else tensors
    optional, seen = set(optional), set()
    unexpected, misshaped, wrong = [], [], set()
    for name, tensor in items:
        slot = slots.get(name)
        if name in optional or name.endswith(IGNORED_SUFFIXES):
            pass
        elif slot is None:
            unexpected.append(name)
        elif tuple(tensor.shape) != slot.shape:
            misshaped.append(f"{name} {tuple(tensor.shape)} != expected {slot.shape}")
            wrong.add(name)
        else:
            slot.load(tensor)
            seen.add(name)
        del tensor     # before the stream makes the next one: a 2 GB table is never held twice
    missing = sorted(set(slots) - seen - wrong)
    if missing or unexpected or misshaped:
        raise WeightLoadError(missing, sorted(unexpected), misshaped)


def random_tensors(slots: Mapping[str, Slot], seed: int, std: float = 0.02) -> Iterable[tuple[str, torch.Tensor]]:
    """Seeded full-size tensors for every slot: N(0, std) weights, ones for norms.

    Each tensor draws from its own generator seeded by (seed, slot order), so every
    tensor-parallel rank produces the same full tensors and keeps its own shard.
    """
    log.debug("random weights (seed=%d); the loader reports which nodes keep them", seed)
    if _CHECKPOINT_FOLLOWS.get():
        # every slot is overwritten next (the match is checked before any copy): skip the RNG
        yield from ((name, torch.empty(slot.shape)) for name, slot in sorted(slots.items()))
        return
    for i, (name, slot) in enumerate(sorted(slots.items())):
        if slot.is_norm:
            yield name, torch.ones(slot.shape)
            continue
        gen = torch.Generator().manual_seed(seed * 1_000_003 + i)
        target = slot.target
        if target is not None and target.numel() >= DRAWN_IN_PLACE and target.is_contiguous():
            yield name, _draw_into(target, gen, std)
        else:
            yield name, torch.randn(slot.shape, generator=gen).mul_(std)    # in place: one fp32 copy of the table


DRAWN_IN_PLACE = 1 << 24     # elements (64 MB in fp32) from which a parameter's draw is written into it in pieces
_DRAW_PIECE = 1 << 22        # elements per piece: a multiple of 16, torch's normal draws 16 values at a time


def _draw_into(param: torch.Tensor, gen: torch.Generator, std: float) -> torch.Tensor:
    """`param` filled with what `torch.randn(param.shape, generator=gen) * std` cast to its dtype holds, drawn a
    piece at a time: a bf16 embedding of 257k x 2k rows never has its 2 GB fp32 draw beside it. The same values bit
    for bit: torch's CPU normal draws its uniforms in order and transforms them 16 at a time, and redraws the last
    16 values of a draw whose size is not a multiple of 16, so pieces of multiples of 16 (the last one at least 16
    long) continue one sequence exactly (tests/runtime/weights/test_random_draw.py)."""
    flat, n, start = param.detach().view(-1), param.numel(), 0
    while start < n:
        end = min(n, start + _DRAW_PIECE)
        end = n if n - end < 16 else end
        flat[start:end].copy_(torch.randn(end - start, generator=gen).mul_(std))
        start = end
    return param


def parameter_slots(module: nn.Module) -> dict[str, Slot]:
    """One slot per parameter, named and shaped as the parameter (norm weights marked)."""
    # by class name (torch's or mstar's RMSNorm; importing runtime.model_executor.layers here would be circular)
    norm_weights = {f"{name}.weight" if name else "weight"
                    for name, m in module.named_modules() if type(m).__name__ in ("LayerNorm", "RMSNorm")}
    return {name: Slot(tuple(param.shape), lambda t, p=param: _copy(p, t), is_norm=name in norm_weights, target=param)
            for name, param in module.named_parameters()}


def module_slots(module: nn.Module) -> dict[str, Slot]:
    """What a module reads from a checkpoint: its own `hf_slots()` (fused or sharded parameters),
    else one slot per parameter under the parameter's name."""
    hf_slots = getattr(module, "hf_slots", None)
    return hf_slots() if callable(hf_slots) else parameter_slots(module)


@torch.no_grad()
def _copy(param: torch.Tensor, tensor: torch.Tensor) -> None:
    if tensor is not param:      # a draw written into the parameter itself (`_draw_into`) is in place already
        param.copy_(tensor)


@contextmanager
def checkpoint_follows() -> Iterator[None]:
    """Inside, `random_tensors` gives uninitialised tensors: the module being built is filled from a
    checkpoint right after (drawing 35B random numbers first costs minutes on a full-size model)."""
    token = _CHECKPOINT_FOLLOWS.set(True)
    try:
        yield
    finally:
        _CHECKPOINT_FOLLOWS.reset(token)


def placeholders_loading() -> bool:
    """Whether the tensors being loaded now are `checkpoint_follows`' uninitialised ones (a quantized linear
    skips them: quantizing what is overwritten next would cost seconds per GB)."""
    return _CHECKPOINT_FOLLOWS.get()
