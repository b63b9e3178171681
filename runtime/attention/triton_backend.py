"""Triton attention backend: the paged decode and prefill kernels of `triton_kernels`.

Decode rows (query length 1) go to the decode kernel, which shares each page read across
a GQA group; prefill chunks go to the prefill kernel. Requests need not be ordered: the
kernels take the list of requests they serve. Block size must be a power of two >= 16.
"""
from __future__ import annotations

import torch

from runtime.attention.backend import AttentionBackend, AttentionShape
from runtime.attention.metadata import AttentionMetadata


class TritonAttention(AttentionBackend):
    name = "triton"

    def plan(self, batch: AttentionMetadata, shape: AttentionShape) -> None:
        if batch.block_size < 16 or batch.block_size & (batch.block_size - 1):
            raise ValueError(f"the triton backend needs a power-of-two block size >= 16, not {batch.block_size}")
        device = batch.seq_lens.device
        decode = [b for b, q in enumerate(batch.query_lens_cpu) if q == 1]
        prefill = [b for b, q in enumerate(batch.query_lens_cpu) if q > 1]
        self._decode_reqs = torch.tensor(decode, dtype=torch.int32, device=device)
        self._decode_rows = batch.query_start_loc[:-1][self._decode_reqs.long()]
        self._prefill_reqs = torch.tensor(prefill, dtype=torch.int32, device=device)
        self._max_prefill_len = max((batch.query_lens_cpu[b] for b in prefill), default=0)

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               batch: AttentionMetadata, scale: float) -> torch.Tensor:
        from runtime.attention import triton_kernels  # imported late: TRITON_INTERPRET must be set first

        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if self._decode_reqs.numel():
            triton_kernels.paged_decode(q, k_cache, v_cache, out, batch.block_tables, batch.seq_lens,
                                        self._decode_reqs, self._decode_rows, scale)
        if self._prefill_reqs.numel():
            triton_kernels.paged_prefill(q, k_cache, v_cache, out, batch.block_tables, batch.seq_lens,
                                         batch.query_start_loc, self._prefill_reqs, self._max_prefill_len, scale)
        return out
