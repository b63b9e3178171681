"""Triton kernels for paged attention: a decode kernel and a prefill (chunked) kernel.

Both walk a request's cache one block at a time with an online softmax, so no
key/value gather is materialised. Block layout "NHD": (num_blocks, block_size, kv_heads, D).

* `paged_decode`: one program per (decode request, kv head); the program handles every
  query head of that kv head's group at once (GQA), reading each block once.
* `paged_prefill`: one program per (prefill request, query head, tile of BLOCK_M query
  rows); query row i of a request with context c sees positions <= c + i.

Scores and the softmax run in fp32 whatever the storage dtype (blocks are loaded and
converted with `.to(tl.float32)`, which also keeps the CPU interpreter away from bf16
arithmetic). On CPU the kernels run under TRITON_INTERPRET=1, set before this module is
imported.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# tl.dot needs every dimension >= 16 on GPUs
_MIN_DOT = 16


@triton.jit
def _attend_block(q, K, V, tables, req, s_bt, blk, s, d, s_kb, s_ks, s_kh, kvh, seq_len, m, l, acc, visible,
                 BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr):
    """Fold one cache block into an online softmax of q's rows, -> (m, l, acc). A row sees the
    block's keys below seq_len where `visible` (broadcast to (rows, BLOCK_SIZE)) holds."""
    block = tl.load(tables + req * s_bt + blk).to(tl.int64)
    pos = blk * BLOCK_SIZE + s
    kv_mask = (pos[:, None] < seq_len) & (d[None, :] < HEAD_DIM)
    offs = block * s_kb + s[:, None] * s_ks + kvh * s_kh + d[None, :]
    k = tl.load(K + offs, mask=kv_mask, other=0.0).to(tl.float32)      # (BLOCK_SIZE, BLOCK_D)
    v = tl.load(V + offs, mask=kv_mask, other=0.0).to(tl.float32)
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)          # (rows, BLOCK_SIZE)
    scores = tl.where(visible & (pos[None, :] < seq_len), scores, float("-inf"))
    m_new = tl.maximum(m, tl.max(scores, 1))
    p = tl.exp(scores - m_new[:, None])
    alpha = tl.exp(m - m_new)
    l = l * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
    return m_new, l, acc


@triton.jit
def _paged_decode_kernel(Q, K, V, O, tables, seq_lens, reqs, rows, scale,
                         s_qt, s_qh, s_kb, s_ks, s_kh, s_bt, s_ot, s_oh,
                         GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    req = tl.load(reqs + tl.program_id(0))
    row = tl.load(rows + tl.program_id(0))
    kvh = tl.program_id(1)
    seq_len = tl.load(seq_lens + req)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    s = tl.arange(0, BLOCK_SIZE)
    q_mask = (g[:, None] < GROUP) & (d[None, :] < HEAD_DIM)
    q = tl.load(Q + row * s_qt + (kvh * GROUP + g)[:, None] * s_qh + d[None, :], mask=q_mask, other=0.0)
    q = q.to(tl.float32) * scale
    m = tl.full([BLOCK_G], -1.0e30, tl.float32)
    l = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for blk in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):     # a decode row sees every cached key
        m, l, acc = _attend_block(q, K, V, tables, req, s_bt, blk, s, d, s_kb, s_ks, s_kh, kvh, seq_len, m, l, acc,
                                 g[:, None] >= 0, BLOCK_SIZE, HEAD_DIM, PRECISION)
    out = acc / l[:, None]
    tl.store(O + row * s_ot + (kvh * GROUP + g)[:, None] * s_oh + d[None, :],
             out.to(O.dtype.element_ty), mask=q_mask)


@triton.jit
def _paged_prefill_kernel(Q, K, V, O, tables, seq_lens, starts, reqs, scale,
                          s_qt, s_qh, s_kb, s_ks, s_kh, s_bt, s_ot, s_oh,
                          GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                          HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    req = tl.load(reqs + tl.program_id(0))
    head = tl.program_id(1)
    tile = tl.program_id(2)
    start = tl.load(starts + req)
    q_len = tl.load(starts + req + 1) - start
    seq_len = tl.load(seq_lens + req)
    i = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    s = tl.arange(0, BLOCK_SIZE)
    q_pos = seq_len - q_len + i
    q_mask = (i[:, None] < q_len) & (d[None, :] < HEAD_DIM)
    q = tl.load(Q + (start + i)[:, None] * s_qt + head * s_qh + d[None, :], mask=q_mask, other=0.0)
    q = q.to(tl.float32) * scale
    kvh = head // GROUP
    m = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    end = tl.minimum(seq_len, seq_len - q_len + (tile + 1) * BLOCK_M)   # causal bound of this tile
    for blk in range(0, tl.cdiv(end, BLOCK_SIZE)):
        causal = (blk * BLOCK_SIZE + s)[None, :] <= q_pos[:, None]
        m, l, acc = _attend_block(q, K, V, tables, req, s_bt, blk, s, d, s_kb, s_ks, s_kh, kvh, seq_len, m, l, acc,
                                 causal, BLOCK_SIZE, HEAD_DIM, PRECISION)
    out = acc / l[:, None]
    tl.store(O + (start + i)[:, None] * s_ot + head * s_oh + d[None, :],
             out.to(O.dtype.element_ty), mask=q_mask)


def _precision(dtype: torch.dtype) -> str:
    # fp32 caches get exact fp32 dots; half-precision caches lose nothing to tf32
    return "ieee" if dtype == torch.float32 else "tf32"


def _strides(q: torch.Tensor, k_cache: torch.Tensor, tables: torch.Tensor, out: torch.Tensor) -> tuple[int, ...]:
    return (q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            tables.stride(0), out.stride(0), out.stride(1))


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                 tables: torch.Tensor, seq_lens: torch.Tensor, reqs: torch.Tensor, rows: torch.Tensor,
                 scale: float) -> None:
    """Write into `out` the attention of query rows `rows` (requests `reqs`, one row each)."""
    num_kv_heads, head_dim, block_size = k_cache.shape[2], k_cache.shape[3], k_cache.shape[1]
    group = q.shape[1] // num_kv_heads
    grid = (reqs.numel(), num_kv_heads)
    _paged_decode_kernel[grid](
        q, k_cache, v_cache, out, tables, seq_lens, reqs, rows, scale, *_strides(q, k_cache, tables, out),
        GROUP=group, BLOCK_G=max(_MIN_DOT, triton.next_power_of_2(group)), BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim, BLOCK_D=max(_MIN_DOT, triton.next_power_of_2(head_dim)),
        PRECISION=_precision(k_cache.dtype))


def paged_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                  tables: torch.Tensor, seq_lens: torch.Tensor, starts: torch.Tensor, reqs: torch.Tensor,
                  max_query_len: int, scale: float, block_m: int = 16) -> None:
    """Write into `out` the causal attention of every query row of requests `reqs`."""
    num_kv_heads, head_dim, block_size = k_cache.shape[2], k_cache.shape[3], k_cache.shape[1]
    grid = (reqs.numel(), q.shape[1], triton.cdiv(max_query_len, block_m))
    _paged_prefill_kernel[grid](
        q, k_cache, v_cache, out, tables, seq_lens, starts, reqs, scale, *_strides(q, k_cache, tables, out),
        GROUP=q.shape[1] // num_kv_heads, BLOCK_M=block_m, BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
        BLOCK_D=max(_MIN_DOT, triton.next_power_of_2(head_dim)), PRECISION=_precision(k_cache.dtype))
