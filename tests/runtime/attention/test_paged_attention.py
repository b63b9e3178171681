"""Paged attention backends equal dense causal SDPA over the same tokens.

A mixed batch — decode rows, a first prefill chunk, a later chunk with context — over a
fragmented cache (blocks out of order, shared by nobody). Triton runs under the
interpreter on CPU (tests/conftest.py sets TRITON_INTERPRET=1), so tensors stay tiny.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from runtime.model_executor.attention import AttentionShape, select_backend, torch_backend
from runtime.model_executor.kv import KVBlockManager, PagedKVCache

HQ, HKV, D, BLOCK = 4, 2, 16, 16
# (cached tokens after the step, new query rows): decode, decode, first chunk, chunk after context
REQUESTS = [(37, 1), (5, 1), (20, 20), (41, 18)]
# fp32 paged kernels against dense SDPA: the same scores summed in another order (an online softmax over 16-key
# blocks, rescaled as it goes), up to 41 keys of 16 lanes: a few fp32 ulps (eps 1.2e-7) on outputs |o| <= 2.3;
# measured max |diff| 4.8e-7, 2% of the bound
FP32_TOL = 1e-5


def _fragmented_batch(dtype: torch.dtype, device: str = "cpu", d: int = D):
    gen = torch.Generator().manual_seed(0)
    manager = KVBlockManager(num_blocks=24, block_size=BLOCK)
    for r in range(len(REQUESTS)):
        manager.allocate(r, 0)
    for _ in range(3):                         # grow round-robin, a block at a time: tables interleave
        for r, (seq, _) in enumerate(REQUESTS):
            manager.append(r, min(BLOCK, seq - manager.num_tokens(r)))
    cache = PagedKVCache(1, 24, BLOCK, HKV, d, dtype=dtype, device=device)
    keys = [torch.randn(seq, HKV, d, generator=gen) for seq, _ in REQUESTS]
    values = [torch.randn(seq, HKV, d, generator=gen) for seq, _ in REQUESTS]
    for r, (seq, _) in enumerate(REQUESTS):
        batch = manager.metadata([(r, seq)], device=device)   # writes every position of request r
        cache.write(0, keys[r].to(device), values[r].to(device), batch.slot_mapping)
    batch = manager.metadata([(r, q) for r, (_, q) in enumerate(REQUESTS)], device=device)
    q = torch.randn(batch.num_tokens, HQ, d, generator=gen)
    return q, cache, batch, keys, values


def _dense_reference(q: torch.Tensor, keys: list, values: list) -> torch.Tensor:
    outs, row = [], 0
    for (seq, q_len), k, v in zip(REQUESTS, keys, values):
        qr = q[row:row + q_len].transpose(0, 1)                         # (Hq, q_len, D)
        k = k.repeat_interleave(HQ // HKV, dim=1).transpose(0, 1)       # (Hq, seq, D)
        v = v.repeat_interleave(HQ // HKV, dim=1).transpose(0, 1)
        mask = torch.ones(q_len, seq, dtype=torch.bool).tril(seq - q_len)
        outs.append(F.scaled_dot_product_attention(qr, k, v, attn_mask=mask).transpose(0, 1))
        row += q_len
    return torch.cat(outs)


@pytest.mark.parametrize("backend", ["torch", "cpu", "triton"])
def test_paged_attention_equals_dense_sdpa(backend: str) -> None:
    q, cache, batch, keys, values = _fragmented_batch(torch.float32)
    assert any(t != tuple(range(t[0], t[0] + len(t))) for t in batch.block_tables_cpu), "cache not fragmented"
    attn = select_backend("cpu", backend)
    attn.plan(batch, AttentionShape(HQ, HKV, D, torch.float32))
    out = attn.attend(q, cache.k[0], cache.v[0], batch, D ** -0.5)
    torch.testing.assert_close(out, _dense_reference(q, keys, values), atol=FP32_TOL, rtol=FP32_TOL)


def test_torch_prefill_after_context_in_several_query_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    # the chunk after context (18 rows) is attended 5 rows at a time: tile edges must not shift the mask
    monkeypatch.setattr("runtime.model_executor.attention.torch_backend.QUERY_TILE", 5)
    q, cache, batch, keys, values = _fragmented_batch(torch.float32)
    attn = select_backend("cpu", "torch")
    attn.plan(batch, AttentionShape(HQ, HKV, D, torch.float32))
    out = attn.attend(q, cache.k[0], cache.v[0], batch, D ** -0.5)
    torch.testing.assert_close(out, _dense_reference(q, keys, values), atol=FP32_TOL, rtol=FP32_TOL)


def test_torch_prefill_rows_are_bit_equal_however_the_prompt_is_cut() -> None:
    """A prompt row attended in a chunk of 2+ rows after context (one masked call of the fused kernel
    over the same keys) is bit-equal to the same row attended with the whole prompt: what keeps answers
    with the prefix cache (which computes only a prompt's uncached rows) equal to answers without it,
    logprobs included. A split of the keys into context and chunk merged by log-sum-exp is 1.3x faster
    at an 8k context but rounds otherwise, and a served Omni test saw its logprobs move in the 7th digit.
    (Query tiles of other heights, or a single row, take other blockings and are not bit-equal.)"""
    gen = torch.Generator().manual_seed(1)
    seq = 80
    k_cache, v_cache = (torch.randn(8, BLOCK, HKV, D, generator=gen) for _ in range(2))
    q = torch.randn(seq, HQ, D, generator=gen)
    blocks = torch.tensor([3, 0, 6, 1, 4])          # out of order, as a cache's blocks are

    def rows(ctx: int) -> torch.Tensor:
        chunk = torch_backend._PrefillChunk(slice(0, seq - ctx), seq, blocks)
        return torch_backend._attend_prefill(q[ctx:], k_cache, v_cache, chunk, D ** -0.5)

    whole = rows(0)
    for ctx in (1, 16, 37, 64, 78):               # chunks of 2+ rows (one row takes another kernel)
        assert torch.equal(rows(ctx), whole[ctx:]), f"rows after a context of {ctx} differ"


def test_triton_bf16_cache_matches_fp32_reference() -> None:
    q, cache, batch, keys, values = _fragmented_batch(torch.bfloat16)
    attn = select_backend("cpu", "triton")
    attn.plan(batch, AttentionShape(HQ, HKV, D, torch.bfloat16))
    out = attn.attend(q.bfloat16(), cache.k[0], cache.v[0], batch, D ** -0.5)
    ref = _dense_reference(q.bfloat16().float(), [k.bfloat16().float() for k in keys],
                           [v.bfloat16().float() for v in values])
    assert out.dtype == torch.bfloat16
    # same bf16 inputs on both sides, fp32 math inside the kernel: the output's one rounding to bf16 (2^-8 relative,
    # half a step of 1.6e-2 at |o| in [2, 4)) on top of the fp32 order differences above; measured max |diff| 1.0e-2,
    # 16% of the bound (2e-2 + 2e-2 * |ref|)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_unknown_backend_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown attention backend"):
        select_backend("cpu", "flash")
    with pytest.raises(ValueError, match="CUDA"):
        select_backend("cpu", "flashinfer")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "flashinfer", "auto"])
def test_cuda_backends_equal_dense_sdpa(backend: str) -> None:
    if backend == "flashinfer":
        pytest.importorskip("flashinfer")
    d = 128   # a head size every FlashInfer build ships
    q, cache, batch, keys, values = _fragmented_batch(torch.float16, device="cuda", d=d)
    attn = select_backend("cuda", backend)
    attn.plan(batch, AttentionShape(HQ, HKV, d, torch.float16))
    out = attn.attend(q.half().cuda(), cache.k[0], cache.v[0], batch, d ** -0.5)
    ref = _dense_reference(q.half().float(), [k.half().float() for k in keys], [v.half().float() for v in values])
    # fp16 on the GPU: the output's rounding (2^-11 = 4.9e-4 relative) and tensor-core dots that round q, k, p to
    # 10-11 bits (tf32 in the Triton kernels, fp16 p in FlashInfer's): 5e-3 is ~10 such roundings at |o| <= 2.3;
    # not measured here (no GPU on the machine that wrote this)
    torch.testing.assert_close(out.float().cpu(), ref, atol=5e-3, rtol=5e-3)
