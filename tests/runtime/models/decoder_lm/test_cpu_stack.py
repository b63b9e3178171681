"""The layer stack in one C++ call (runtime/model_executor/layers/cpu_stack.py) against the per-layer path it replaces.

Both make the same kernel calls with the same arguments in the same order, so the check is bit
equality of every logit, not a tolerance: decode rows alone, prompts alone, a prompt cut into
chunks after cached context, and prompts and decode rows mixed in one batch; fp32 and bf16
weights, packed for the panel GEMM as a worker packs them (bf16 on AMX CPUs: the panel GEMM for
batches of up to AMX_PANEL_ROWS rows, oneDNN's tile kernels above, which the stack leaves to the
per-layer path)."""
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
def test_the_stack_gives_the_per_layer_paths_logits_bit_for_bit(case: str, dtype: torch.dtype, calls) -> None:
    model = _model(case, dtype)
    per_layer = _logits(model, stack=False)
    assert not calls
    stacked = _logits(model, stack=True)
    assert isinstance(model.cpu_stack, LayerStack)
    rows = [7, 1, 10, 15, 17, 4, 2]          # each batch of the script's rows
    if cpu_linear.gemm_kernel(dtype) == "split":   # bf16 on AMX: batches over AMX_PANEL_ROWS run on oneDNN
        rows = [n for n in rows if n <= cpu_linear.AMX_PANEL_ROWS]
    assert calls == rows, "every batch the panel GEMM takes ran as one stack call (its rows)"
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


def test_with_split_packing_only_batches_on_the_panel_copy_take_the_stack(calls, monkeypatch) -> None:
    """AMX machines pack bf16 weights twice ("split"): batches of at most AMX_PANEL_ROWS rows run the panel copy
    (the stack can), larger ones oneDNN's (the per-layer path). Here, without AMX, the choice is made as if the CPU
    had it; both copies' GEMMs are real."""
    from runtime.model_executor.parallel import cpu_linear
    if not (cpu_linear.onednn_available() and cpu_linear.bf16_packable()):
        pytest.skip("no oneDNN bf16 GEMM on this CPU")
    monkeypatch.setattr(cpu_linear, "_has_amx", lambda: True)
    model = _model("llama", torch.bfloat16)
    assert isinstance(model.model.layers[0].mlp.down_proj.packed, tuple)
    stacked = _logits(model, stack=True)
    assert calls == [r for r in (7, 1, 10, 15, 17, 4, 2) if r <= cpu_linear.AMX_PANEL_ROWS]
    assert all(torch.equal(a, b) for a, b in zip(stacked, _logits(model, stack=False)))


def test_weights_loaded_and_packed_again_are_the_ones_the_stack_reads(calls) -> None:
    """The layer table holds addresses of packed copies: packing again (after new weights) must reach it."""
    model = _model("llama", torch.float32)
    before = _logits(model, stack=True)
    other = build(CASES["llama"][0], tiny_dims(CASES["llama"][0]), backend="auto", seed=1)
    model.load_state_dict(other.state_dict())
    assert pack_linears(model) > 0
    stack = model.cpu_stack
    stacked = _logits(model, stack=True)
    assert model.cpu_stack is stack and len(calls) == 2 * len(_script())     # the same table, filled again
    assert not torch.equal(stacked[0], before[0])
    assert all(torch.equal(a, b) for a, b in zip(stacked, _logits(model, stack=False)))
