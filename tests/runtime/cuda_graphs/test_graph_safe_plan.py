"""A graph-safe backend's `plan` keeps its device tensors where a captured graph saw them.

White-box: a CUDA graph replays kernels with the addresses of the index tensors that
existed at capture, so re-planning a batch of the same layout must refill those tensors
in place (and leave them alone when nothing changed), never allocate new ones.
"""
from __future__ import annotations

import torch

from runtime.model_executor.attention import AttentionMetadata, AttentionShape, select_backend

SHAPE = AttentionShape(4, 2, 16, torch.float32)


def _batch(query_lens: list[int]) -> AttentionMetadata:
    seq_lens = [q + 4 for q in query_lens]
    return AttentionMetadata.build(query_lens, seq_lens, [[b] for b in range(len(query_lens))], 16)


def test_triton_plan_refills_index_tensors_in_place() -> None:
    backend = select_backend("cpu", "triton")
    assert backend.is_graph_safe and not select_backend("cpu", "torch").is_graph_safe
    backend.plan(_batch([1, 3]), SHAPE)
    reqs, rows, prefill = backend._decode_reqs, backend._decode_rows, backend._prefill_reqs
    pointers = [t.data_ptr() for t in (reqs, rows, prefill)]
    backend.plan(_batch([3, 1]), SHAPE)              # same layout sizes, other requests decode
    assert backend._decode_reqs is reqs and backend._decode_rows is rows and backend._prefill_reqs is prefill
    assert [t.data_ptr() for t in (reqs, rows, prefill)] == pointers
    assert reqs.tolist() == [1] and rows.tolist() == [3] and prefill.tolist() == [0]
    backend.plan(_batch([1, 1, 1]), SHAPE)           # another layout: new tensors are fine here
    assert backend._decode_reqs.tolist() == [0, 1, 2] and backend._decode_rows.tolist() == [0, 1, 2]
