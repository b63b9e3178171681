"""A large parameter's seeded random values are written into it a piece at a time (runtime/model_executor/weights/
slots.py `_draw_into`: a bf16 table never has its fp32 draw beside it), and they are the values the whole draw
cast to the parameter's dtype holds, bit for bit: the oracle is torch's own one-shot draw, not the loader's code."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from runtime.model_executor.weights import slots as slots_module
from runtime.model_executor.weights.slots import load_into, parameter_slots, random_tensors


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(37, 64), (129, 7), (5, 3)])   # whole pieces; a last piece not a multiple of 16
def test_a_large_parameter_drawn_in_place_holds_the_one_shot_draw(monkeypatch: pytest.MonkeyPatch,
                                                                   dtype: torch.dtype, shape: tuple[int, int]) -> None:
    monkeypatch.setattr(slots_module, "DRAWN_IN_PLACE", 64)     # the real threshold is 16M elements: scaled down
    monkeypatch.setattr(slots_module, "_DRAW_PIECE", 48)
    module = nn.Embedding(*shape).to(dtype)
    slots = parameter_slots(module)
    drawn = dict(random_tensors(slots, seed=7))
    assert drawn["weight"] is module.weight if module.weight.numel() >= 64 else drawn["weight"] is not module.weight
    load_into(slots, drawn.items())
    gen = torch.Generator().manual_seed(7 * 1_000_003 + 0)     # random_tensors' seed for the first slot
    expected = (torch.randn(shape, generator=gen) * 0.02).to(dtype)
    assert torch.equal(module.weight.detach(), expected)


def test_the_piece_size_continues_torch_normal_sequence() -> None:
    """torch's CPU normal transforms uniforms 16 at a time: pieces of multiples of 16 continue one draw."""
    assert slots_module._DRAW_PIECE % 16 == 0
