"""The layer stack in one C++ call (runtime/model_executor/layers/cpu_stack.py) against the per-layer path it replaces.

Both make the same kernel calls with the same arguments in the same order, so the check is bit
equality of every logit, not a tolerance: decode rows alone, prompts alone, a prompt cut into
chunks after cached context, and prompts and decode rows mixed in one batch; fp32 and bf16
weights, packed for the panel GEMM as a worker packs them (`MSTAR_CPU_LINEAR=mstar`: bf16 on AMX CPUs packs for
oneDNN's tile kernels by default, which the stack leaves to the per-layer path)."""
from __future__ import annotations

import pytest
import torch

from runtime.model_executor.kernels import cpu as cpu_kernels
from runtime.model_executor.layers.cpu_stack import LayerStack
from runtime.model_executor.parallel import cpu_linear, pack_linears
from tests.runtime.models.decoder_lm.lm_factories import CASES, PagedRunner, build, tiny_dims

pytestmark = pytest.mark.skipif(cpu_kernels.status() != "", reason=f"CPU kernels: {cpu_kernels.status()}")


@pytest.fixture
def calls(monkeypatch) -> list[int]:
    """The row count of every stack call made while the test runs (the real call runs)."""
    seen: list[int] = []
    real = cpu_kernels.decoder_stack
    monkeypatch.setattr(cpu_kernels, "decoder_stack", lambda *a: seen.append(a[5]) or real(*a))
    return seen


def _model(case: str, dtype: torch.dtype):
    kind, overrides = CASES[case]
    model = build(kind, tiny_dims(kind, **overrides), backend="auto").to(dtype)
    assert pack_linears(model) > 0
    return model


def _script() -> list[list[tuple[str, list[int]]]]:
    """Batches of (request, new tokens): a prompt alone, decode rows alone, a prompt in chunks beside decode
    rows (its second chunk after 9 cached tokens), two prompts in one batch, then decode rows of all."""
    gen = torch.Generator().manual_seed(1)
    prompt = lambda n: torch.randint(1, 200, (n,), generator=gen).tolist()   # noqa: E731
    long = prompt(23)
    return [[("a", prompt(7))], [("a", [5])], [("a", [9]), ("b", long[:9])], [("b", long[9:]), ("a", [11])],
            [("c", prompt(5)), ("d", prompt(12))], [("a", [3]), ("b", [4]), ("c", [6]), ("d", [8])],
            [("d", [2]), ("b", [1])]]


def _logits(model, stack: bool) -> list[torch.Tensor]:
    """The script's logits, with the stack (the model's own, kept from an earlier call) or without."""
    if not stack:
        model.cpu_stack = False
    elif not isinstance(model.cpu_stack, LayerStack):
        model.cpu_stack = None        # the next forward decides
    runner = PagedRunner(model, num_blocks=64, block_size=4)
    return [rows for batch in _script() for rows in runner.step(batch)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["llama", "qwen2"])
def test_the_stack_gives_the_per_layer_paths_logits_bit_for_bit(case: str, dtype: torch.dtype, calls,
                                                                  monkeypatch) -> None:
    monkeypatch.setenv("MSTAR_CPU_LINEAR", "mstar")     # the panel GEMM (auto packs bf16 for oneDNN on AMX CPUs)
    model = _model(case, dtype)
    per_layer = _logits(model, stack=False)
    assert not calls
    stacked = _logits(model, stack=True)
    assert isinstance(model.cpu_stack, LayerStack)
    assert calls == [7, 1, 10, 15, 17, 4, 2], "every batch ran as one stack call (its rows)"
    for i, (a, b) in enumerate(zip(stacked, per_layer)):
        assert torch.equal(a, b), f"request row group {i}: the stack's logits differ from the per-layer path's"


@pytest.mark.parametrize("case, why", [("qwen3", "q/k norms"), ("llama-tied-llama3-bias", "o_proj and down_proj biases")])
def test_layers_the_stack_does_not_take_run_the_per_layer_path(case: str, why: str) -> None:
    model = _model(case, torch.float32)
    assert LayerStack.for_model(model) is None, why
    _logits(model, stack=True)
    assert model.cpu_stack is False


def test_unpacked_weights_run_the_per_layer_path(calls) -> None:
    kind, overrides = CASES["llama"]
    model = build(kind, tiny_dims(kind, **overrides), backend="auto")     # not packed: its linears are F.linear
    stacked = _logits(model, stack=True)
    assert isinstance(model.cpu_stack, LayerStack) and not calls      # eligible model, but no batch could run
    assert all(torch.equal(a, b) for a, b in zip(stacked, _logits(model, stack=False)))


def test_weights_packed_for_onednn_run_the_per_layer_path(calls, monkeypatch) -> None:
    """bf16 on an AMX CPU packs for oneDNN's tile kernels (`auto`): the stack reads panels only, so every batch
    runs the per-layer path, on the same oneDNN copies. Here the choice is made as if the CPU had AMX."""
    if not (cpu_linear.onednn_available() and cpu_linear.bf16_packable()):
        pytest.skip("no oneDNN bf16 GEMM on this CPU")
    monkeypatch.setenv("MSTAR_CPU_LINEAR", "auto")
    monkeypatch.setattr(cpu_linear, "_has_amx", lambda: True)
    model = _model("llama", torch.bfloat16)
    assert model.model.layers[0].mlp.down_proj.packed.dim() == 2       # oneDNN's blocked copy, not panels
    stacked = _logits(model, stack=True)
    assert isinstance(model.cpu_stack, LayerStack) and not calls
    assert all(torch.equal(a, b) for a, b in zip(stacked, _logits(model, stack=False)))


def test_a_model_packed_twice_keeps_its_table(calls) -> None:
    """Packing again finds nothing to pack (each weight's packed copy is its only one): the table the stack
    filled stays valid."""
    model = _model("llama", torch.float32)
    before = _logits(model, stack=True)
    stack = model.cpu_stack
    assert pack_linears(model) == 0
    again = _logits(model, stack=True)
    assert model.cpu_stack is stack and len(calls) == 2 * len(_script())
    assert all(torch.equal(a, b) for a, b in zip(again, before))
