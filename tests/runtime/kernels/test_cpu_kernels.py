"""The fused CPU kernels (runtime/model_executor/kernels/cpu.py) against the torch ops they replace, and a decoder
run through them against the same decoder on its torch ops.

Tolerances, from what differs: fp32 results differ only in summation order (sums of 64..1536
products: a few fp32 ulps, so 1e-5 relative to values of order 1) and, for SiLU and softmax, in the
exp (the kernel's polynomial is ~1 ulp from libm's); bf16 results are rounded at the points torch
rounds them, so they agree to one bf16 ulp (2^-8 relative) where an fp32 difference of an ulp
tips a rounding. Residual sums are one rounding of the same two values on both sides: equal.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from runtime.model_executor.attention import select_backend
from runtime.model_executor.kernels import cpu as cpu_kernels
from runtime.model_executor.layers.norm import RMSNorm
from runtime.model_executor.layers.rotary import RotaryEmbedding, rotate
from tests.runtime.models.decoder_lm.lm_factories import CASES, PagedRunner, build, tiny_dims

# fp32: the kernels sum in another order (64..1536 products) and take exp from their own polynomial (~1 ulp from
# libm's): a few ulps (eps 1.2e-7) of values up to ~7 (130 for SiLU of inputs x4); measured max 2% of the bound
FP32_RTOL = 1e-5
# bf16: both sides round at the same points, so they differ by one bf16 rounding (2^-8 relative) where an fp32 ulp
# of difference tips it; measured: norms and SiLU exact, attention max |diff| 7.8e-3 at |o| < 4 (65% of the bound)
BF16_ULP = 2.0 ** -8
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(autouse=True)
def kernels_built() -> None:
    assert cpu_kernels.status() == "", cpu_kernels.status()     # this machine has a C++ compiler


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, rtol: float = FP32_RTOL) -> None:
    if dtype == torch.bfloat16:
        rtol = BF16_ULP
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=rtol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, n", [(1, 64), (5, 576), (33, 100)])
def test_norms_match_rmsnorm(dtype, rows, n) -> None:
    g = torch.Generator().manual_seed(rows)
    norm = RMSNorm(n, 1e-5)
    norm.weight.data = torch.randn(n, generator=g)
    norm = norm.to(dtype)
    wide = torch.randn(rows, n + 7, generator=g).to(dtype)
    x, delta = wide[:, :n], torch.randn(rows, n, generator=g).to(dtype)      # x: a row-strided view
    with torch.no_grad():
        close(cpu_kernels.rms_norm(x, norm.weight, norm.eps), norm(x), dtype)
        residual = x.clone()
        normed = cpu_kernels.add_rms_norm(residual, delta, norm.weight, norm.eps)
        assert torch.equal(residual, x + delta)
        close(normed, norm(x + delta), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, n", [(1, 8), (16, 1536), (3, 101)])
def test_silu_mul_matches_torch(dtype, rows, n) -> None:
    gate_up = (torch.randn(rows, 2 * n, generator=torch.Generator().manual_seed(n)) * 4).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    close(cpu_kernels.silu_mul(gate_up), F.silu(gate) * up, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, n", [(1, 5), (16, 49152), (3, 101), (7, 16), (2, 33)])
def test_argmax_is_torchs_first_maximum(dtype, rows, n) -> None:
    g = torch.Generator().manual_seed(n)
    wide = (torch.randn(rows, n + 3, generator=g) * 3).to(dtype)
    x = wide[:, :n]                                          # a row-strided view
    want = torch.argmax(x, dim=-1)
    assert torch.equal(cpu_kernels.argmax(x), want)
    # ties: the row's maximum placed again after (and before) its first place, in other lanes and the tail
    tied = x.clone()
    for r in range(rows):
        top = tied[r].max()
        for at in (n - 1, n // 2, max(n // 3, 0), 0):
            tied[r, at] = top
    assert torch.equal(cpu_kernels.argmax(tied), torch.argmax(tied, dim=-1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax_takes_the_first_nan_and_all_minus_inf_rows_as_torch_does(dtype) -> None:
    n = 100
    x = torch.randn(5, n, generator=torch.Generator().manual_seed(1)).to(dtype)
    x[0, 40], x[0, 70] = float("nan"), float("nan")         # in the lanes
    x[1, 98] = float("nan")                                  # in the tail
    x[1, 3] = 1e4
    x[2, 0] = float("nan")
    x[3] = float("-inf")
    x[4, 50] = float("inf")
    got = cpu_kernels.argmax(x)
    assert got.tolist() == torch.argmax(x, dim=-1).tolist() == [40, 98, 0, 0, 50]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq, hkv, d", [(9, 3, 64), (4, 4, 128), (8, 1, 16)])
def test_rope_cache_rotates_in_place_and_writes_the_slots(dtype, hq, hkv, d) -> None:
    g = torch.Generator().manual_seed(d)
    rows, block_size, blocks = 7, 4, 6
    cos, sin = RotaryEmbedding(d, 10000.0).cos_sin(torch.tensor([0, 1, 5, 9, 100, 2047, 3]), dtype)
    qkv = torch.randn(rows, (hq + 2 * hkv) * d, generator=g).to(dtype)
    q, k, v = (t.view(rows, -1, d) for t in qkv.split([hq * d, hkv * d, hkv * d], dim=-1))   # row-strided views
    want_q, want_k, want_v = rotate(q, cos, sin), rotate(k, cos, sin), v.clone()
    k_cache = torch.randn(blocks, block_size, hkv, d, generator=g).to(dtype)
    v_cache = torch.randn(blocks, block_size, hkv, d, generator=g).to(dtype)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    slots = torch.tensor([3, 0, 22, 9, 10, 17, 5])
    cpu_kernels.rope_cache(q, k, v, cos, sin, slots, k_cache, v_cache)
    close(q, want_q, dtype)
    close(k, want_k, dtype)
    flat_k, flat_v = k_cache.view(-1, hkv, d), v_cache.view(-1, hkv, d)
    assert torch.equal(flat_k[slots], k) and torch.equal(flat_v[slots], want_v)
    others = torch.ones(blocks * block_size, dtype=torch.bool)
    others[slots] = False
    assert torch.equal(flat_k[others], before_k.view(-1, hkv, d)[others])
    assert torch.equal(flat_v[others], before_v.view(-1, hkv, d)[others])


def _reference_decode(q, k_cache, v_cache, tables, lengths, scale):
    out = []
    hkv = k_cache.shape[2]
    for b in range(q.shape[0]):
        keys = k_cache[tables[b]].flatten(0, 1)[: lengths[b]].float()                  # (L, Hkv, D)
        values = v_cache[tables[b]].flatten(0, 1)[: lengths[b]].float()
        qh = q[b].float().view(hkv, -1, q.shape[-1])                                   # (Hkv, G, D)
        p = (torch.einsum("hgd,lhd->hgl", qh, keys) * scale).softmax(-1)
        out.append(torch.einsum("hgl,lhd->hgd", p, values).reshape(q.shape[1:]))
    return torch.stack(out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq, hkv, d", [(9, 3, 64), (8, 2, 64), (2, 2, 128), (8, 4, 128), (16, 2, 128), (32, 1, 32)])
@pytest.mark.parametrize("lengths", [[600], [1, 16, 17, 255, 600, 40]])
def test_paged_decode_matches_dense_attention(dtype, hq, hkv, d, lengths) -> None:
    """Lengths of 1 token, within one block, across blocks and past the kernel's 256-key score chunk; one
    request (its kv heads split over the threads) and six (a request per thread's item). Heads of 64 and 128
    in groups of up to 4 and 2 take the register path (a head at a time), the others the general one."""
    g = torch.Generator().manual_seed(hq)
    block_size, lengths = 16, torch.tensor(lengths)
    width = -(-int(lengths.max()) // block_size)
    blocks = len(lengths) * width + 3
    k_cache = torch.randn(blocks, block_size, hkv, d, generator=g).to(dtype)
    v_cache = torch.randn(blocks, block_size, hkv, d, generator=g).to(dtype)
    tables = torch.randperm(blocks, generator=g)[: len(lengths) * width].view(len(lengths), width)
    q = (torch.randn(len(lengths), hq, d, generator=g) * 2).to(dtype)
    got = cpu_kernels.paged_decode(q, k_cache, v_cache, tables, lengths, d ** -0.5)
    # bf16: the output is one rounding of an fp32 result; fp32: summation order and exp (measured max |diff| 1.9e-6,
    # 6% of 2e-5 * (1 + |o|))
    close(got, _reference_decode(q, k_cache, v_cache, tables, lengths, d ** -0.5), dtype, rtol=2e-5)


def test_paged_decode_reads_query_rows_in_place_from_a_wider_tensor() -> None:
    """q as the layer hands it over, the first columns of the fused QKV output: the kernel reads each row at its
    stride, with the same result as from a contiguous copy."""
    g = torch.Generator().manual_seed(5)
    hq, hkv, d, lengths = 9, 3, 64, torch.tensor([40, 7, 130])
    k_cache, v_cache = (torch.randn(30, 16, hkv, d, generator=g) for _ in range(2))
    tables = torch.randperm(30, generator=g)[:27].view(3, 9)
    qkv = torch.randn(3, (hq + 2 * hkv) * d, generator=g)
    q = qkv[:, :hq * d].view(3, hq, d)
    assert not q.is_contiguous()
    got = cpu_kernels.paged_decode(q, k_cache, v_cache, tables, lengths, 0.125)
    assert torch.equal(got, cpu_kernels.paged_decode(q.contiguous(), k_cache, v_cache, tables, lengths, 0.125))


def _reference_prefill(q, k_cache, v_cache, blocks, context, scale):
    n, hq, d = q.shape
    group, seq = hq // k_cache.shape[2], context + n
    keys = k_cache[blocks].flatten(0, 1)[:seq].float().repeat_interleave(group, 1).transpose(0, 1)  # (Hq, S, D)
    values = v_cache[blocks].flatten(0, 1)[:seq].float().repeat_interleave(group, 1).transpose(0, 1)
    mask = torch.ones(n, seq, dtype=torch.bool).tril(context)                     # row i sees keys 0 .. context + i
    p = (q.float().transpose(0, 1) @ keys.transpose(1, 2) * scale).masked_fill(~mask, float("-inf")).softmax(-1)
    return (p @ values).transpose(0, 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq, hkv, d, block_size", [(9, 3, 64, 16), (2, 2, 128, 16), (8, 1, 32, 7), (6, 6, 48, 5)])
@pytest.mark.parametrize("context, n", [(0, 1), (0, 20), (37, 18), (0, 300), (600, 77)])
def test_paged_prefill_matches_dense_causal_attention(dtype, hq, hkv, d, block_size, context, n) -> None:
    """A whole prompt and chunks after context, of 1 row to several query tiles, over key tiles cut inside
    blocks (block sizes 5 and 7); groups of 1, 3 and 8 query heads per kv head; head dims of 1 to 8 vectors."""
    g = torch.Generator().manual_seed(hq * 1000 + context + n)
    seq = context + n
    num_blocks = -(-seq // block_size)
    k_cache, v_cache = (torch.randn(num_blocks + 3, block_size, hkv, d, generator=g).to(dtype) for _ in range(2))
    blocks = torch.randperm(num_blocks + 3, generator=g)[:num_blocks]
    q = (torch.randn(n, hq, d, generator=g) * 2).to(dtype)
    got = cpu_kernels.paged_prefill(q, k_cache, v_cache, blocks, context, d ** -0.5)
    # as the decode kernel: fp32 differs in summation order and exp (up to 677 keys); bf16 is one rounding (measured
    # fp32 max |diff| 4.5e-6, 12% of the bound)
    close(got, _reference_prefill(q, k_cache, v_cache, blocks, context, d ** -0.5), dtype, rtol=2e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_prefill_rows_are_bit_equal_however_the_prompt_is_cut(dtype) -> None:
    """What keeps answers with the prefix cache (which computes a prompt's uncached rows only) equal to answers
    without it: a row attended after any context, key tile edges (16 keys on AVX2, 64 on AVX-512) and block edges
    included, or beside any other rows, is bit-equal to the same row attended with the whole prompt."""
    g = torch.Generator().manual_seed(7)
    seq, block_size = 333, 16
    k_cache, v_cache = (torch.randn(24, block_size, 3, 64, generator=g).to(dtype) for _ in range(2))
    blocks = torch.randperm(24, generator=g)[:21]
    q = torch.randn(seq, 9, 64, generator=g).to(dtype)
    whole = cpu_kernels.paged_prefill(q, k_cache, v_cache, blocks, 0, 0.125)
    for context in (1, 15, 16, 31, 32, 37, 63, 64, 65, 128, 200, 331, 332):
        rows = cpu_kernels.paged_prefill(q[context:], k_cache, v_cache, blocks, context, 0.125)
        assert torch.equal(rows, whole[context:]), f"rows after a context of {context} differ"
    middle = cpu_kernels.paged_prefill(q[100:140], k_cache, v_cache, blocks[:9], 100, 0.125)   # keys 0 .. 139
    assert torch.equal(middle, whole[100:140]), "a chunk ending mid-prompt differs"


@pytest.mark.parametrize("case", ["llama", "llama-tied-llama3-bias", "qwen3", "qwen3_moe"])
def test_a_decoder_on_the_kernels_gives_its_torch_tokens(case: str, monkeypatch) -> None:
    """Prefill and decode rows mixed in one batch, 10 greedy steps: the same tokens, and logits to 1e-4
    (30-odd fp32 kernels in a row, each a few ulps, on logits of order 1..10)."""
    kind, overrides = CASES[case]
    runs = {}
    for mode in ("fused", "torch"):
        monkeypatch.setattr(cpu_kernels, "_status", "" if mode == "fused" else "switched off for the test")
        model = build(kind, tiny_dims(kind, **overrides), backend="auto")
        assert model.attention_backend(torch.device("cpu")).name == ("cpu" if mode == "fused" else "torch")
        runner, tokens, logits = PagedRunner(model, num_blocks=64, block_size=4), {"a": [3, 17, 101, 7, 250],
                                                                                  "b": [9, 8]}, []
        for step in range(10):
            chunks = [("a", tokens["a"] if step == 0 else tokens["a"][-1:])]
            if step == 3:
                chunks.append(("b", tokens["b"]))          # a prompt joins running decodes
            elif step > 3:
                chunks.append(("b", tokens["b"][-1:]))
            for (req, _), rows in zip(chunks, runner.step(chunks)):
                tokens[req].append(int(rows[-1].argmax()))
                logits.append(rows[-1])
        runs[mode] = (tokens, torch.stack(logits))
    assert runs["fused"][0] == runs["torch"][0]
    # the docstring's bound: 30-odd fp32 kernels in a row, each a few ulps (eps 1.2e-7); measured max 2.1e-7
    torch.testing.assert_close(runs["fused"][1], runs["torch"][1], rtol=1e-4, atol=1e-4)


def test_a_forward_autograd_tracks_runs_the_torch_ops() -> None:
    """The kernels write in place where autograd cannot see: with a graph kept, the layers take torch's
    ops, and gradients reach the weights."""
    model = build("llama_lm", tiny_dims("llama_lm"), backend="auto")
    runner = PagedRunner(model, num_blocks=16, block_size=4)
    assert not cpu_kernels.usable(torch.ones(2, requires_grad=True)) and cpu_kernels.usable(torch.ones(2))
    runner.manager.allocate("r", 0)
    runner.cache.copy_blocks(runner.manager.append("r", 3))
    batch = runner.manager.metadata([("r", 3)])
    hidden = model(torch.tensor([1, 2, 3]), torch.arange(3), batch, runner.cache)
    model.compute_logits(hidden).sum().backward()
    assert model.model.layers[0].mlp.down_proj.weight.grad is not None


def test_switched_off_and_unbuildable_kernels_are_said(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(cpu_kernels, "_status", None)
    monkeypatch.setenv("MSTAR_CPU_KERNELS", "torch")
    assert cpu_kernels.status() == "switched off (MSTAR_CPU_KERNELS=torch)"
    assert not cpu_kernels.usable(torch.ones(2)) and select_backend("cpu").name == "torch"
    with pytest.raises(ValueError, match="switched off"):
        select_backend("cpu", "cpu")
    monkeypatch.setattr(cpu_kernels, "_status", None)
    monkeypatch.delenv("MSTAR_CPU_KERNELS")
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("MSTAR_KERNEL_CACHE", str(tmp_path / "cache"))     # nothing built there yet
    assert cpu_kernels.status().startswith("not built: ") and "no-such-compiler" in cpu_kernels.status()
    assert cpu_kernels.describe() == cpu_kernels.status()
