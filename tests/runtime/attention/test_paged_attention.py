"""Paged attention backends equal dense causal SDPA over the same tokens.

A mixed batch — decode rows, a first prefill chunk, a later chunk with context — over a
fragmented cache (blocks out of order, shared by nobody). Triton runs under the
interpreter on CPU (tests/conftest.py sets TRITON_INTERPRET=1), so tensors stay tiny.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from runtime.attention import AttentionShape, select_backend, torch_backend
from runtime.kv import KVBlockManager, PagedKVCache

HQ, HKV, D, BLOCK = 4, 2, 16, 16
# (cached tokens after the step, new query rows): decode, decode, first chunk, chunk after context
REQUESTS = [(37, 1), (5, 1), (20, 20), (41, 18)]


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


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_paged_attention_equals_dense_sdpa(backend: str) -> None:
    q, cache, batch, keys, values = _fragmented_batch(torch.float32)
    assert any(t != tuple(range(t[0], t[0] + len(t))) for t in batch.block_tables_cpu), "cache not fragmented"
    attn = select_backend("cpu", backend)
    attn.plan(batch, AttentionShape(HQ, HKV, D, torch.float32))
    out = attn.attend(q, cache.k[0], cache.v[0], batch, D ** -0.5)
    torch.testing.assert_close(out, _dense_reference(q, keys, values), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("ctx, n", [(37, 18), (160, 64), (5, 3)])
def test_torch_prefill_after_context_split_and_tiled_equal_dense_sdpa(monkeypatch: pytest.MonkeyPatch,
                                                                       ctx: int, n: int) -> None:
    """A chunk of n rows after ctx cached tokens: the CPU split (context without a mask, the chunk's own
    rows causal, merged by log-sum-exp) and the masked tiles other devices take (5 rows per tile here,
    so tile edges must not shift the mask) both equal masked dense SDPA."""
    gen = torch.Generator().manual_seed(ctx)
    q = torch.randn(1, HQ, n, D, generator=gen)
    k, v = (torch.randn(1, HKV, ctx + n, D, generator=gen) for _ in range(2))
    mask = torch.ones(n, ctx + n, dtype=torch.bool).tril(ctx)
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(HQ // HKV, 1), v.repeat_interleave(HQ // HKV, 1),
                                         attn_mask=mask, scale=D ** -0.5)
    monkeypatch.setattr(torch_backend, "QUERY_TILE", 5)
    # fp32 every way; the split sums the softmax in two parts: a few ulps on outputs of size ~1
    for after_context in (torch_backend._after_context_cpu, torch_backend._after_context_tiled):
        torch.testing.assert_close(after_context(q, k, v, ctx, D ** -0.5), ref, atol=1e-5, rtol=1e-5)


def test_triton_bf16_cache_matches_fp32_reference() -> None:
    q, cache, batch, keys, values = _fragmented_batch(torch.bfloat16)
    attn = select_backend("cpu", "triton")
    attn.plan(batch, AttentionShape(HQ, HKV, D, torch.bfloat16))
    out = attn.attend(q.bfloat16(), cache.k[0], cache.v[0], batch, D ** -0.5)
    ref = _dense_reference(q.bfloat16().float(), [k.bfloat16().float() for k in keys],
                           [v.bfloat16().float() for v in values])
    assert out.dtype == torch.bfloat16
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
    torch.testing.assert_close(out.float().cpu(), ref, atol=5e-3, rtol=5e-3)
