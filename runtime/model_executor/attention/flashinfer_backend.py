"""FlashInfer attention backend (CUDA only; used when `flashinfer` imports).

The block tables become FlashInfer's CSR page table (indptr, indices, last_page_len): FlashInfer's
"page" is our KV block, and its argument names (`page_size`, `last_page_len`) stay the library's.
A decode-only batch uses `BatchDecodeWithPagedKVCacheWrapper`; any batch with a prefill
chunk uses `BatchPrefillWithPagedKVCacheWrapper`, whose causal mask is aligned to the
end of each request's keys (query i of a chunk of q sees kv_len - q + i), matching
`AttentionMetadata`. The KV tensors are "NHD": (num_blocks, block_size, kv_heads, head_dim).
"""
from __future__ import annotations

import torch

from runtime.model_executor.attention.backend import AttentionBackend, AttentionShape
from runtime.model_executor.attention.metadata import AttentionMetadata

_WORKSPACE_BYTES = 128 * 1024 * 1024


class FlashInferAttention(AttentionBackend):
    name = "flashinfer"

    def __init__(self, device: torch.device) -> None:
        import flashinfer

        workspace = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        # tensor-core decode handles any GQA group size (SmolLM2's is 3)
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True)
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        self._wrapper = self._prefill
        self._scale: float | None = None

    def plan(self, batch: AttentionMetadata, shape: AttentionShape) -> None:
        # FlashInfer plans on the host: indptr / last_page_len / qo_indptr stay CPU tensors (its pages are
        # our KV blocks: page_size is the block size, last_page_len the tokens in each request's last block)
        tables, bs = batch.block_tables_cpu, batch.block_size
        indptr = torch.tensor([0] + [len(t) for t in tables], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        indices = torch.tensor([b for t in tables for b in t], dtype=torch.int32).to(batch.seq_lens.device)
        last = torch.tensor([s - (len(t) - 1) * bs for t, s in zip(tables, batch.seq_lens_cpu)], dtype=torch.int32)
        common = dict(num_qo_heads=shape.num_q_heads, num_kv_heads=shape.num_kv_heads, page_size=bs,
                      q_data_type=shape.dtype, kv_data_type=shape.dtype, sm_scale=shape.head_dim ** -0.5)
        if batch.is_decode_only:
            self._decode.plan(indptr, indices, last, head_dim=shape.head_dim, **common)
            self._wrapper = self._decode
        else:
            qo_indptr = torch.tensor([0, *batch.query_lens_cpu], dtype=torch.int32).cumsum(0, dtype=torch.int32)
            self._prefill.plan(qo_indptr, indptr, indices, last, head_dim_qk=shape.head_dim, causal=True, **common)
            self._wrapper = self._prefill
        self._scale = common["sm_scale"]

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               batch: AttentionMetadata, scale: float) -> torch.Tensor:
        if scale != self._scale:
            raise ValueError(f"flashinfer was planned with softmax scale {self._scale}, called with {scale}")
        return self._wrapper.run(q.contiguous(), (k_cache, v_cache))
