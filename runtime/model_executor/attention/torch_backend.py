"""Reference attention backend in plain torch (any device; the CPU path).

Decode rows (query length 1) of all requests are attended in one batched call: their
blocks are gathered into a padded (B, L, kv_heads, D) tensor and masked beyond each
request's length. Prefill chunks are attended one request at a time, which keeps large
prompts free of padding, through torch's fused (flash) SDPA kernel for CPU: it needs 4-D
tensors and no (heads x T x T) score matrix is ever built, so a prefill's memory grows
linearly with the prompt. A chunk with no context (a whole prompt) is plain top-left
causal; a chunk after context (chunked prefill) is attended QUERY_TILE rows at a time with
an explicit (rows, keys) mask, built per tile so it too stays linear in the prompt.

Everything that depends only on the batch layout (block lists, masks, row indices) is
built once in `plan`, from the host copies of the metadata, not once per layer.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.nn.functional as F

from runtime.model_executor.attention.backend import AttentionBackend, AttentionShape
from runtime.model_executor.attention.metadata import AttentionMetadata


# query rows per masked tile of a chunk after context: its mask is QUERY_TILE x seq_len
# (8 MiB of bool at 16k tokens), and tiles this tall keep the fused kernel's blocks full
QUERY_TILE = 512


@dataclass(frozen=True)
class _PrefillChunk:
    rows: slice                 # the chunk's query rows in the packed batch
    seq_len: int                # cached tokens of the request after this step
    blocks: torch.Tensor        # (num_blocks,) int64 cache blocks of the request

    @property
    def context(self) -> int:
        """Tokens cached before this chunk (0: the chunk is the whole prompt)."""
        return self.seq_len - (self.rows.stop - self.rows.start)


class TorchAttention(AttentionBackend):
    name = "torch"

    def plan(self, batch: AttentionMetadata, shape: AttentionShape) -> None:
        device = batch.seq_lens.device
        starts = list(accumulate(batch.query_lens_cpu, initial=0))
        decode = [b for b, q in enumerate(batch.query_lens_cpu) if q == 1]
        self._is_decode_only = len(decode) == batch.num_requests
        self._decode_rows = torch.tensor([starts[b] for b in decode], dtype=torch.long, device=device)
        width = max((len(batch.block_tables_cpu[b]) for b in decode), default=0)
        blocks = [p for b in decode for p in _padded(batch.block_tables_cpu[b], width)]
        self._decode_blocks = torch.tensor(blocks, dtype=torch.long, device=device)     # (Bd * width,)
        keys = torch.arange(width * batch.block_size, device=device)
        lengths = torch.tensor([batch.seq_lens_cpu[b] for b in decode], device=device)
        valid = keys[None, :] < lengths[:, None]                                          # (Bd, L)
        bias = torch.zeros(valid.shape, dtype=shape.dtype, device=device).masked_fill(~valid, float("-inf"))
        self._decode_bias = bias[:, None, None, :]                                        # (Bd, 1, 1, L)
        self._prefill = [_prefill_chunk(batch, b, starts[b], device)
                         for b, q in enumerate(batch.query_lens_cpu) if q > 1]

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               batch: AttentionMetadata, scale: float) -> torch.Tensor:
        if self._is_decode_only:
            return self._attend_decode(q, k_cache, v_cache, scale)
        out = torch.empty_like(q)
        if self._decode_rows.numel():
            out[self._decode_rows] = self._attend_decode(q[self._decode_rows], k_cache, v_cache, scale)
        for chunk in self._prefill:
            self._attend_chunk(q[chunk.rows], k_cache, v_cache, chunk, scale, out[chunk.rows])
        return out

    def _attend_chunk(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, chunk: _PrefillChunk,
                      scale: float, out: torch.Tensor) -> None:
        out.copy_(_attend_prefill(q, k_cache, v_cache, chunk, scale))

    def _attend_decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       scale: float) -> torch.Tensor:
        n, hq, d = q.shape
        hkv = k_cache.shape[2]
        # index_select on the block axis is several times faster than advanced indexing on CPU
        k = k_cache.index_select(0, self._decode_blocks).view(n, -1, hkv, d).transpose(1, 2)  # (B, Hkv, L, D)
        v = v_cache.index_select(0, self._decode_blocks).view(n, -1, hkv, d).transpose(1, 2)
        q = q.view(n, hkv, hq // hkv, d)                                # (B, Hkv, group, D)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=self._decode_bias.to(q.dtype), scale=scale)
        return o.reshape(n, hq, d)


def _padded(blocks: tuple[int, ...], width: int) -> tuple[int, ...]:
    # block 0 stands in for missing blocks: they lie beyond the request's length and are masked
    return blocks + (0,) * (width - len(blocks))


def _prefill_chunk(batch: AttentionMetadata, b: int, start: int, device: torch.device) -> _PrefillChunk:
    blocks = torch.tensor(batch.block_tables_cpu[b], dtype=torch.long, device=device)
    return _PrefillChunk(slice(start, start + batch.query_lens_cpu[b]), batch.seq_lens_cpu[b], blocks)


def _attend_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    chunk: _PrefillChunk, scale: float) -> torch.Tensor:
    s, ctx = chunk.seq_len, chunk.context
    k = k_cache.index_select(0, chunk.blocks).flatten(0, 1)[:s].transpose(0, 1)[None]  # (1, Hkv, S, D)
    v = v_cache.index_select(0, chunk.blocks).flatten(0, 1)[:s].transpose(0, 1)[None]
    q = q.transpose(0, 1)[None]                                                         # (1, Hq, q_len, D)
    if ctx == 0:
        o = F.scaled_dot_product_attention(_padded_rows(q), k, v, is_causal=True, scale=scale, enable_gqa=True)
        return o[0, :, :q.shape[2]].transpose(0, 1)                                     # (q_len, Hq, D)
    out = torch.empty_like(q)
    for a in range(0, q.shape[2], QUERY_TILE):
        b = min(a + QUERY_TILE, q.shape[2])
        end = ctx + b                                  # the tile's last row sees keys 0 .. end - 1
        tile = _padded_rows(q[:, :, a:b])
        rows = torch.arange(ctx + a, ctx + a + tile.shape[2], device=q.device).clamp(max=end - 1)
        mask = torch.arange(end, device=q.device)[None, :] <= rows[:, None]
        out[:, :, a:b] = F.scaled_dot_product_attention(tile, k[:, :, :end], v[:, :, :end], attn_mask=mask,
                                                         scale=scale, enable_gqa=True)[:, :, :b - a]
    return out[0].transpose(0, 1)                                                       # (q_len, Hq, D)


def _padded_rows(q: torch.Tensor) -> torch.Tensor:
    """q (1, H, n, D) with copies of its last row appended, so that torch's fused CPU kernel, which cuts the
    query rows into blocks of 32 (64 from 192 rows, 256 from 768), ends on a block of at least 4 rows: a
    block of 1-3 rows takes another GEMM path on AVX2 CPUs (AMD EPYC Zen 2), and its rows then differ in the
    last bits from the same rows attended in a larger call. The copies' outputs are dropped."""
    n = q.shape[2]
    padded = n
    while padded % (256 if padded >= 768 else 64 if padded >= 192 else 32) in (1, 2, 3):
        padded += 1
    return q if padded == n else torch.cat([q, q[:, :, -1:].expand(-1, -1, padded - n, -1)], dim=2)
