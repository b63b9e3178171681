"""The CPU attention backend: decode rows and prefill chunks through the fused paged kernels.

Decode rows (query length 1) are attended by `runtime.model_executor.kernels.cpu.paged_decode`, which
reads each request's keys and values from their blocks where they lie: no gather into a padded
dense copy per layer, no mask tensor, one pass over the cached context, scores and softmax in
fp32. Prefill chunks go to `paged_prefill`, flash-style over the same blocks (tiles of keys under a
running max: memory linear in the prompt), about twice torch's fused SDPA on these chunks
(`python tools/bench.py kernels`), each row bit-equal however its prompt is cut, as the torch path's.
`select_backend` picks this backend on CPU when the kernels are built, else the torch one; heads
the kernels do not take (head_dim > 256, or not a multiple of 16 for prefill) take the torch path.
"""
from __future__ import annotations

import torch

from runtime.model_executor.attention.backend import AttentionShape
from runtime.model_executor.attention.metadata import AttentionMetadata
from runtime.model_executor.attention.torch_backend import TorchAttention, _PrefillChunk
from runtime.model_executor.kernels import cpu as cpu_kernels


class CpuAttention(TorchAttention):
    name = "cpu"

    def plan(self, batch: AttentionMetadata, shape: AttentionShape) -> None:
        super().plan(batch, shape)
        decode = [b for b, q in enumerate(batch.query_lens_cpu) if q == 1]
        width = max((len(batch.block_tables_cpu[b]) for b in decode), default=0)
        tables = [batch.block_tables_cpu[b] + (0,) * (width - len(batch.block_tables_cpu[b])) for b in decode]
        self._tables = torch.tensor(tables, dtype=torch.long).view(len(decode), width)
        self._lengths = torch.tensor([batch.seq_lens_cpu[b] for b in decode], dtype=torch.long)
        self._fits = cpu_kernels.heads_fit(shape.head_dim)
        self._prefill_fits = cpu_kernels.prefill_heads_fit(shape.head_dim)

    def stack_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The planned batch for cpu_stack.cpp: [decode rows, table width, prefill chunks] and the addresses of
        the decode rows' indices, tables and lengths and of the chunks' first rows, sizes, contexts and block
        ids (one address per chunk), int64; the tensors behind them live until the next plan."""
        chunks = self._prefill
        self._chunk_rows = torch.tensor([[c.rows.start for c in chunks], [c.rows.stop - c.rows.start for c in chunks],
                                         [c.context for c in chunks]], dtype=torch.long).view(3, len(chunks))
        self._chunk_blocks = torch.tensor([c.blocks.data_ptr() for c in chunks], dtype=torch.long)
        info = torch.tensor([self._decode_rows.numel(), self._tables.shape[1], len(chunks)], dtype=torch.long)
        addresses = [self._decode_rows.data_ptr(), self._tables.data_ptr(), self._lengths.data_ptr(),
                     *(self._chunk_rows[i].data_ptr() for i in range(3)), self._chunk_blocks.data_ptr()]
        return info, torch.tensor(addresses, dtype=torch.long)

    def _attend_decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       scale: float) -> torch.Tensor:
        if not self._fits or q.dtype != k_cache.dtype or not cpu_kernels.usable(q):
            return super()._attend_decode(q, k_cache, v_cache, scale)
        return cpu_kernels.paged_decode(q, k_cache, v_cache, self._tables, self._lengths, scale)

    def _attend_chunk(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, chunk: _PrefillChunk,
                      scale: float, out: torch.Tensor) -> None:
        if not self._prefill_fits or q.dtype != k_cache.dtype or not cpu_kernels.usable(q):
            return super()._attend_chunk(q, k_cache, v_cache, chunk, scale, out)
        cpu_kernels.paged_prefill(q, k_cache, v_cache, chunk.blocks, chunk.context, scale, out=out)
