"""Decode attention written for a compiler: read the paged cache where it lies, no dense copy.

Who uses it: the compiled CPU decode steps of runtime/model_executor/compiled (`CompiledDecodeSteps`),
whose whole step inductor turns into C++/OpenMP loops. Written as elementwise products and
sums over the gathered view of the cache (not `index_select` + SDPA, which inductor must
call as library kernels on a materialised copy), inductor fuses the block lookup, the q.k
reduction, the length mask, the softmax and the p.v reduction into a few loops that read
each cached key and value once, straight from its block: the fused paged-attention decode
the eager torch backend cannot express. Eagerly this formula is slower than the torch
backend (it builds (B, L, Hkv, G, D) products); it is meant to run compiled.

Decode rows only (query length 1 per request). Scores, softmax and sums run in fp32
whatever the cache dtype, as the eager backend's SDPA does on CPU.
"""
from __future__ import annotations

import torch

from runtime.model_executor.attention.backend import AttentionBackend, AttentionShape
from runtime.model_executor.attention.metadata import AttentionMetadata

# a compiled step marks the block-table width dynamic; torch specialises sizes 0 and 1,
# so tables are padded to at least this many blocks (the padding is masked)
MIN_WIDTH = 2


class PagedDecodeAttention(AttentionBackend):
    name = "paged_decode"

    def plan(self, batch: AttentionMetadata, shape: AttentionShape) -> None:
        if not batch.is_decode_only:
            raise ValueError("the paged decode attention takes decode rows only (query length 1 per request)")
        width = max(MIN_WIDTH, *(len(t) for t in batch.block_tables_cpu))
        # missing blocks repeat the request's first one: they lie past its length and are masked
        rows = [t + (t[0],) * (width - len(t)) for t in batch.block_tables_cpu]
        self.blocks = torch.tensor(rows, dtype=torch.long, device=batch.seq_lens.device)     # (B, W)
        torch._dynamo.maybe_mark_dynamic(self.blocks, 1)     # one compiled kernel for every context length
        self.seq_lens = batch.seq_lens

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               batch: AttentionMetadata, scale: float) -> torch.Tensor:
        n, hq, d = q.shape
        hkv = k_cache.shape[2]
        k = k_cache[self.blocks].flatten(1, 2).float()                    # (B, L, Hkv, D): a view once compiled
        v = v_cache[self.blocks].flatten(1, 2).float()
        qf = q.float().view(n, 1, hkv, hq // hkv, d)                      # (B, 1, Hkv, G, D)
        scores = (qf * k[:, :, :, None, :]).sum(-1) * scale               # (B, L, Hkv, G)
        keys = torch.arange(k.shape[1], device=q.device)
        beyond = keys[None, :] >= self.seq_lens[:, None]                  # (B, L)
        scores = scores.masked_fill(beyond[:, :, None, None], float("-inf"))
        p = scores.softmax(dim=1)
        out = (p[..., None] * v[:, :, :, None, :]).sum(1)                 # (B, Hkv, G, D)
        return out.reshape(n, hq, d).to(q.dtype)
