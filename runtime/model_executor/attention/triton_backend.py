"""Triton attention backend: the paged decode and prefill kernels of `triton_kernels`.

Decode rows (query length 1) go to the decode kernel, which shares each block read across
a GQA group; prefill chunks go to the prefill kernel. Requests need not be ordered: the
kernels take the list of requests they serve. Block size must be a power of two >= 16.

CUDA graphs: the kernels read only device tensors — the batch's block tables, lengths
and query offsets, and this backend's request/row index lists. `plan` keeps those lists
in buffers it fills in place (or leaves alone when the layout did not change), so a
graph captured after a `plan` stays valid for every later batch of the same layout:
one backend instance per captured batch bucket (runtime/model_executor/compiled).
"""
from __future__ import annotations

from itertools import accumulate
from typing import Sequence

import torch

from runtime.model_executor.attention.backend import AttentionBackend, AttentionShape
from runtime.model_executor.attention.metadata import AttentionMetadata


class TritonAttention(AttentionBackend):
    name = "triton"
    is_graph_safe = True

    def __init__(self) -> None:
        self._buffers: dict[str, tuple[tuple[int, ...], torch.Tensor]] = {}

    def plan(self, batch: AttentionMetadata, shape: AttentionShape) -> None:
        if batch.block_size < 16 or batch.block_size & (batch.block_size - 1):
            raise ValueError(f"the triton backend needs a power-of-two block size >= 16, not {batch.block_size}")
        device = batch.seq_lens.device
        starts = list(accumulate(batch.query_lens_cpu, initial=0))
        decode = [b for b, q in enumerate(batch.query_lens_cpu) if q == 1]
        prefill = [b for b, q in enumerate(batch.query_lens_cpu) if q > 1]
        self._decode_reqs = self._fill("decode_reqs", decode, device)
        self._decode_rows = self._fill("decode_rows", [starts[b] for b in decode], device)
        self._prefill_reqs = self._fill("prefill_reqs", prefill, device)
        self._max_prefill_len = max((batch.query_lens_cpu[b] for b in prefill), default=0)

    def _fill(self, name: str, values: Sequence[int], device: torch.device) -> torch.Tensor:
        """An int32 device tensor holding `values`: the previous one, refilled in place when
        only the values changed, a new one when the length or device changed."""
        values = tuple(values)
        old_values, buffer = self._buffers.get(name, ((), None))
        if buffer is not None and old_values == values and buffer.device == device:
            return buffer
        fresh = torch.tensor(values, dtype=torch.int32)
        if buffer is not None and len(old_values) == len(values) and buffer.device == device:
            buffer.copy_(fresh, non_blocking=True)
        else:
            buffer = fresh.to(device)
        self._buffers[name] = (values, buffer)
        return buffer

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               batch: AttentionMetadata, scale: float) -> torch.Tensor:
        from runtime.model_executor.attention import triton_kernels  # imported late: TRITON_INTERPRET must be set first

        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if self._decode_reqs.numel():
            triton_kernels.paged_decode(q, k_cache, v_cache, out, batch.block_tables, batch.seq_lens,
                                        self._decode_reqs, self._decode_rows, scale)
        if self._prefill_reqs.numel():
            triton_kernels.paged_prefill(q, k_cache, v_cache, out, batch.block_tables, batch.seq_lens,
                                         batch.query_start_loc, self._prefill_reqs, self._max_prefill_len, scale)
        return out
