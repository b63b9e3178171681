"""Linear weights packed on CPU (runtime.model_executor.parallel.cpu_linear) compute what the plain weights
compute: per layer to float tolerance, and the same greedy tokens over a paged decode. Each packed weight is
its only copy: the dense parameter becomes a meta stand-in (state_dict names, shapes and dtypes stay), and a
tied embedding reads its rows from the LM head's panels."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.runtime.models.decoder_lm.lm_factories import CASES, PagedRunner, build, tiny_dims
from runtime.model_executor.parallel import ColumnParallelLinear, ParallelLMHead, RowParallelLinear, pack_linears
from runtime.model_executor.parallel import cpu_linear
from runtime.model_executor.parallel.cpu_linear import (PackedLinear, bf16_packable, gemm_kernel, linear,
                                         onednn_available, pack_weight)


@pytest.fixture(params=["mstar", "onednn"])
def kernel(request, monkeypatch) -> str:
    """Each packed GEMM kernel in turn (MSTAR_CPU_LINEAR), whichever `auto` picks on this CPU."""
    if request.param == "onednn" and not onednn_available():
        pytest.skip("this torch has no oneDNN linear")
    monkeypatch.setenv("MSTAR_CPU_LINEAR", request.param)
    assert gemm_kernel() == request.param      # the panel GEMM builds here (a C++ compiler is part of the setup)
    return request.param


# against fp32 math on the same inputs: fp32 differs in summation order only (sums of 40 terms, ulp ~2e-6 at |y| ~24:
# 1e-5 relative is a few roundings); bf16 adds one rounding of each output (2^-8 = 3.9e-3 relative). Measured max
# |diff|: fp32 0 (this CPU's blocking sums in torch's order), bf16 6.2e-2 at |y| <= 24, 12% of the bound
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("rows", [0, 1, 3, 16, 37])
def test_packed_linear_matches_f_linear(kernel, dtype, tol, rows) -> None:
    if kernel == "onednn" and dtype == torch.bfloat16 and not bf16_packable():
        pytest.skip("oneDNN has no bf16 kernels for this CPU (AVX2 only)")
    g = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(48, 40, generator=g).to(dtype), torch.randn(48, generator=g).to(dtype)
    x = torch.randn(2, rows, 40, generator=g).to(dtype)
    packed = pack_weight(weight)
    assert packed is not None
    out = linear(x, weight, bias, packed)
    ref = torch.nn.functional.linear(x.float(), weight.float(), bias.float())
    assert out.shape == (2, rows, 48) and out.dtype == dtype
    assert torch.allclose(out.float(), ref, rtol=tol, atol=tol * 10)


# as above, for sums of 333 terms at |y| <= 76 (measured max |diff|: fp32 0, bf16 0.22, 15% of the bound)
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_a_panel_gemm_row_does_not_depend_on_the_batch(monkeypatch, dtype, tol) -> None:
    """Each output of the panel GEMM is one in-order sum over k: a row comes out bit-equal alone, in
    any block position and beside any other rows (what batch invariance asks of a kernel), whichever
    block shape the row count picks (AVX-512: 8 rows x 3 panels, 12 x 2 for 9-12 and 17-36 rows;
    AVX2: 6 x 1). 213 outputs are 14 panels: sets of three with two left over, the last one partial;
    k = 333 is odd (bf16 panels hold k in pairs)."""
    monkeypatch.setenv("MSTAR_CPU_LINEAR", "mstar")
    g = torch.Generator().manual_seed(7)
    weight, x = torch.randn(213, 333, generator=g).to(dtype), torch.randn(50, 333, generator=g).to(dtype)
    packed = pack_weight(weight)
    together = linear(x, weight, None, packed)
    # against fp32 math on the same (exactly representable) inputs: in fp32 only the summation order differs
    # (sums of ~20 whose ulp is 2e-6: 1e-5 relative leaves room for tens of roundings); bf16 rounds each
    # output once (2^-8 relative) on top of that
    ref = torch.nn.functional.linear(x.float(), weight.float())
    assert torch.allclose(together.float(), ref, rtol=tol, atol=tol * 10)
    for a, b in ((0, 1), (5, 6), (3, 16), (30, 37), (0, 12), (2, 26), (0, 48)):
        assert torch.equal(linear(x[a:b], weight, None, packed), together[a:b])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [16, 50])
def test_a_panel_gemm_does_not_depend_on_the_thread_count(monkeypatch, dtype, rows) -> None:
    """Each thread takes a contiguous share of the sets of panels (cpu.cpp gemm_blocks): 1, 2, 3 and 7
    threads split 14 panels (5 sets of three on AVX-512, the last partial) unevenly, one thread's share
    empty at 7; every output is still the same one in-order sum, so the results are bit-equal."""
    monkeypatch.setenv("MSTAR_CPU_LINEAR", "mstar")
    g = torch.Generator().manual_seed(rows)
    weight, x = torch.randn(213, 333, generator=g).to(dtype), torch.randn(rows, 333, generator=g).to(dtype)
    packed = pack_weight(weight)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3, 7):
            torch.set_num_threads(threads)
            outs.append(linear(x, weight, None, packed))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(out, outs[0]) for out in outs[1:])
    # the same bound as above: fp32 sums of ~20 (ulp 2e-6); bf16 adds one rounding of each output (2^-8); measured
    # max |diff| as there (bf16 0.22 at |y| <= 70)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    ref = torch.nn.functional.linear(x.float(), weight.float())
    assert torch.allclose(outs[0].float(), ref, rtol=tol, atol=tol * 10)


def test_bf16_weights_on_a_cpu_without_bf16_kernels_are_left_and_said(monkeypatch) -> None:
    """oneDNN refuses to pack bf16 where the CPU has no bf16 instructions it uses (AVX2 only; it raised at
    load, and the worker was restarted forever): there, with oneDNN chosen, the weight stays unpacked, its
    linear is F.linear's, and the loader's note says why. Where the CPU has them, the probe is turned off
    to take the same path."""
    if not onednn_available():
        pytest.skip("this torch has no oneDNN linear")
    monkeypatch.setenv("MSTAR_CPU_LINEAR", "onednn")
    if bf16_packable():
        monkeypatch.setattr(cpu_linear, "bf16_packable", lambda: False)
    weight, x = torch.randn(48, 40).bfloat16(), torch.randn(3, 40).bfloat16()
    assert pack_weight(weight) is None and pack_weight(weight.float()) is not None
    assert torch.equal(linear(x, weight, None, None), torch.nn.functional.linear(x, weight))
    assert "no bf16 instructions" in cpu_linear.bf16_gemm_note()
    monkeypatch.setenv("MSTAR_CPU_LINEAR", "mstar")       # the panel GEMM takes bf16 on any CPU
    assert pack_weight(weight) is not None and cpu_linear.bf16_gemm_note() is None


def test_auto_takes_the_panel_gemm_except_for_bf16_on_amx_cpus(monkeypatch) -> None:
    """`auto`: the panel GEMM wherever it builds (measured faster than oneDNN on AVX2 and AVX-512 CPUs, and in fp32
    on AMX ones); for bf16 where the CPU has AMX tiles, oneDNN (its tile kernels measured 1.5x the panel GEMM at
    16 rows and 2.8x at 64, 0.75x at one row; one packed copy, so one kernel); the flags are this CPU's with and
    without amx_bf16."""
    from runtime.model_executor.kernels import cpu as cpu_kernels
    if not onednn_available():
        pytest.skip("this torch has no oneDNN linear")
    monkeypatch.setenv("MSTAR_CPU_LINEAR", "auto")
    flags = [f for f in cpu_kernels.cpu_flags().split() if not f.startswith("amx")]
    monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda: " ".join(flags))
    assert gemm_kernel() == gemm_kernel(torch.bfloat16) == "mstar"
    monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda: " ".join(flags + ["amx_bf16", "amx_tile"]))
    assert gemm_kernel(torch.float32) == "mstar"
    assert gemm_kernel(torch.bfloat16) == "onednn"
    monkeypatch.setenv("MSTAR_CPU_LINEAR", "mstar")        # the panel GEMM asked for
    assert gemm_kernel(torch.bfloat16) == "mstar"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_table_read_by_rows_is_packed_in_panels_and_read_back_exactly(monkeypatch, dtype) -> None:
    """A table that is also read by rows (a tied embedding) is packed in panels whatever the kernel choice, and
    its rows and column ranges come back from the panels: rows bit for bit (a copy), a range of the logits bit
    for bit those of the whole GEMM (each output is one in-order sum over k, whatever the panels around it).
    213 rows (the last panel partial), k = 333 odd (bf16 panels hold k in pairs)."""
    from runtime.model_executor.kernels import cpu as cpu_kernels
    monkeypatch.setenv("MSTAR_CPU_LINEAR", "onednn" if onednn_available() else "mstar")
    g = torch.Generator().manual_seed(3)
    table, x = torch.randn(213, 333, generator=g).to(dtype), torch.randn(5, 333, generator=g).to(dtype)
    panels = pack_weight(table, rows_read=True)
    assert panels is not None and panels.dim() == 3
    ids = torch.tensor([[0, 15, 16], [212, 7, 200]])
    assert torch.equal(cpu_kernels.panel_rows(panels, ids, 333), table[ids])
    whole = linear(x, table, None, panels)
    for lo, hi in ((0, 213), (5, 9), (16, 48), (17, 212), (200, 213)):
        assert torch.equal(cpu_kernels.gemm_columns(x, panels, lo, hi), whole[:, lo:hi])


def test_the_kernel_switch_refuses_unknown_values(monkeypatch) -> None:
    monkeypatch.setenv("MSTAR_CPU_LINEAR", "mkl")
    with pytest.raises(ValueError, match="auto, mstar, onednn, torch"):
        gemm_kernel()


def test_weights_that_cannot_be_packed_are_left() -> None:
    assert pack_weight(torch.randn(4, 4, dtype=torch.float64)) is None
    assert pack_weight(torch.randn(2, 4, 4)) is None
    assert pack_weight(torch.randn(0, 4)) is None


@pytest.mark.parametrize("case", ["llama", "llama-tied-llama3-bias", "qwen3_moe"])
@torch.no_grad()
def test_packed_decoder_gives_the_same_tokens(kernel: str, case: str) -> None:
    kind, overrides = CASES[case]
    plain, packed = build(kind, tiny_dims(kind, **overrides)), build(kind, tiny_dims(kind, **overrides))
    dense = {k: (v.shape, v.dtype) for k, v in packed.state_dict().items()}
    count = pack_linears(packed)
    assert count >= 4 * packed.config.num_layers   # qkv, o, gate-up / router, down per layer at least
    assert {k: (v.shape, v.dtype) for k, v in packed.state_dict().items()} == dense    # names, shapes, dtypes stand
    gone = {k for k, v in packed.state_dict().items() if v.device.type == "meta"}
    assert gone and all(".weight" in k or "experts." in k for k in gone)   # the packed copy is the only one
    kinds = {type(m) for m in packed.modules()}
    assert nn.Linear not in kinds and {ColumnParallelLinear, RowParallelLinear, ParallelLMHead} <= kinds
    runs = {}
    for name, model in (("plain", plain), ("packed", packed)):
        runner, tokens, logits = PagedRunner(model, num_blocks=32, block_size=4), [3, 17, 101, 7, 250], []
        for step in range(12):
            rows = runner.step([("r", tokens if step == 0 else tokens[-1:])])[0]
            logits.append(rows[-1])
            tokens.append(int(rows[-1].argmax()))
        runs[name] = (tokens, torch.stack(logits))
    assert runs["plain"][0] == runs["packed"][0]
    # 12 steps of a 2-layer fp32 decoder on another GEMM kernel (default rtol 1e-5 too): order differences of a few
    # ulps (eps 1.2e-7) per GEMM on logits |l| <= 1; measured max |diff| 1.8e-7, 0.2% of the bound
    assert torch.allclose(runs["plain"][1], runs["packed"][1], atol=1e-4)


def test_switched_off_by_environment(monkeypatch) -> None:
    monkeypatch.setenv("MSTAR_CPU_LINEAR", "torch")
    model = build("llama_lm", tiny_dims("llama_lm"))
    assert pack_linears(model) == 0
    assert all(getattr(m, "packed", None) is None for m in model.modules())


def test_plain_linear_children_are_swapped_around_the_same_bias() -> None:
    parent = nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 4, bias=False))
    bias = parent[0].bias
    x = torch.randn(5, 8)
    ref = parent(x)
    assert pack_linears(parent) == 2
    assert isinstance(parent[0], PackedLinear) and parent[0].bias is bias
    assert parent[0].weight.device.type == "meta" and parent[0].weight.shape == (12, 8)
    # the packed GEMM against MKL's on 8- and 12-term fp32 sums (default rtol 1e-5 too): at most a few ulps in
    # another summation order at |y| <= 0.63; measured exact here
    assert torch.allclose(parent(x), ref, atol=1e-6)


def test_a_weight_two_modules_hold_stays_dense_and_unpacked() -> None:
    """Packing it would free nothing (the other holder keeps the dense copy): a second copy is not made."""
    embed, head = nn.Embedding(12, 8), nn.Linear(8, 12, bias=False)
    head.weight = embed.weight
    parent = nn.ModuleDict({"embed": embed, "head": head, "other": nn.Linear(8, 8)})
    assert pack_linears(parent) == 1
    assert type(parent["head"]) is nn.Linear and parent["head"].weight is embed.weight
    assert isinstance(parent["other"], PackedLinear)
