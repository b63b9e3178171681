"""The bound suite's measurements: weight bytes (a tied weight once), read bandwidth, the GEMMs
of a decode step alone (every packed linear and the LM head), their FLOPs and the cache-resident
torch.mm rate that sets their compute floor."""
from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from bench import stats

from bench.suite_bound import PEAK_PRODUCTS, PEAK_SIZE, gemm_flops, gemm_rate, gemms_ms, read_bandwidth, step_gemms, weight_bytes


def test_weight_bytes_count_a_tied_weight_once_and_every_dtype_at_its_size() -> None:
    embed, head = nn.Embedding(100, 8), nn.Linear(8, 100, bias=False)
    head.weight = embed.weight                                     # tied, as SmolLM2's LM head
    model = nn.ModuleDict({"embed": embed, "head": head, "norm": nn.LayerNorm(8)}).to(torch.bfloat16)
    assert weight_bytes(model) == (100 * 8 + 8 + 8) * 2


@pytest.mark.parametrize("kernel, dtype", [("mstar", torch.float32), ("onednn", torch.bfloat16)])
def test_a_packed_model_s_bytes_are_its_packed_copies(monkeypatch, kernel: str, dtype: torch.dtype) -> None:
    """Packed, each weight's packed copy is its only one: the bytes stay those of the dense model (the tiny
    preset's widths are multiples of the panel GEMM's 16 columns and even, so no panel pads; oneDNN's blocked
    copy is opaque and counted by its elements)."""
    from mstar_compiler.catalogue import load_catalogue
    from runtime.model_executor.components import component_class
    from runtime.model_executor.parallel import pack_linears
    from runtime.model_executor.parallel.cpu_linear import bf16_packable, onednn_available
    if kernel == "onednn" and not (onednn_available() and bf16_packable()):
        pytest.skip("no oneDNN bf16 GEMM on this CPU")
    monkeypatch.setenv("MSTAR_CPU_LINEAR", kernel)
    dims = load_catalogue()["llama_lm"].presets["tiny"]
    model = component_class("llama_lm")(dims, {"seed": 0}).eval().to(dtype)
    dense = weight_bytes(model)
    assert pack_linears(model) > 0
    assert weight_bytes(model) == dense


def test_read_bandwidth_is_bytes_over_the_median_sum_time() -> None:
    buffer = torch.ones(1 << 20)
    assert 1e8 < read_bandwidth(buffer) < 1e13                     # 4 MiB read: between 0.1 GB/s and 10 TB/s


def test_gemm_flops_are_two_per_multiply_add_of_every_gemm() -> None:
    gemms = [(torch.zeros(6, 4), None, torch.zeros(1)), (torch.zeros(3, 6), torch.zeros(3), torch.zeros(1))]
    assert gemm_flops(gemms, 5) == 2 * 5 * (6 * 4 + 3 * 6)


def test_gemm_rate_is_flops_over_the_median_time(monkeypatch) -> None:
    assert 1e8 < gemm_rate(torch.float32) < 1e15                   # between 0.1 GFLOP/s and 1 PFLOP/s
    # the arithmetic, on a clock that moves 0.25 s a reading: every timing is 0.25 s
    ticks = itertools.count()
    monkeypatch.setattr(stats, "perf_counter", lambda: 0.25 * next(ticks))
    assert gemm_rate(torch.float32) == 2 * PEAK_SIZE ** 3 * PEAK_PRODUCTS / 0.25
    assert read_bandwidth(torch.ones(1 << 10)) == 4 * (1 << 10) / 0.25


def test_step_gemms_are_every_packed_linear_and_the_lm_head_in_model_order() -> None:
    from mstar_compiler.catalogue import load_catalogue
    from runtime.model_executor.components import component_class
    from runtime.model_executor.parallel import pack_linears
    from runtime.model_executor.parallel.cpu_linear import onednn_available
    if not onednn_available():
        import pytest
        pytest.skip("oneDNN's packed linear is not available in this torch build")
    dims = load_catalogue()["llama_lm"].presets["tiny"]
    model = component_class("llama_lm")(dims, {"seed": 0}).eval()
    packed = pack_linears(model)
    gemms = step_gemms(model)
    assert len(gemms) == packed > 0
    head = [w for w, _, _ in gemms if w.shape[0] == dims["vocab_size"]]
    assert len(head) == 1                                          # the LM head, once
    if model.config.tie_word_embeddings:                           # its weight is the embedding table
        assert head[0] is model.model.embed_tokens.weight
    assert all(p.dtype == w.dtype for w, _, p in gemms)
    assert gemms_ms(gemms, 4, 2) > 0
