"""The interface every attention backend implements (torch, triton, flashinfer).

Call protocol, per forward of a model:
  1. `plan(batch, shape)` once, before the first layer: backends precompute whatever
     depends only on the batch layout (index splits, FlashInfer's plan);
  2. `attend(q, k_cache, v_cache, batch, scale)` once per layer, after the layer wrote
     its new keys/values into the cache at `batch.slot_mapping`.
A backend with `is_graph_safe` may have its `attend` calls captured in a CUDA graph after
a `plan`, and be re-planned before each replay with batches of the same layout
(runtime/model_executor/compiled): `plan` then refills its device tensors in place.

Tensors:
  q        (N, num_q_heads, head_dim)                          packed query rows
  k_cache  (num_blocks, block_size, num_kv_heads, head_dim)    one layer's keys ("NHD" blocks)
  v_cache  same as k_cache
  returns  (N, num_q_heads, head_dim)
Query row i of request b attends to that request's cached positions
0 .. seq_len[b] - query_len[b] + i (causal, including itself). num_q_heads is a multiple
of num_kv_heads (grouped-query attention: q head h reads kv head h // group).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from runtime.model_executor.attention.metadata import AttentionMetadata


@dataclass(frozen=True)
class AttentionShape:
    """Head geometry of the layers that will attend (per tensor-parallel rank)."""

    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def group(self) -> int:
        return self.num_q_heads // self.num_kv_heads


class AttentionBackend(ABC):
    """Paged causal attention over a packed batch of prefill chunks and decode tokens."""

    name: str = ""
    # whether `attend` may run inside a CUDA graph after a `plan`: it launches only device work
    # that reads tensors kept at fixed addresses, and `plan` refills them in place
    is_graph_safe: bool = False

    def plan(self, batch: AttentionMetadata, shape: AttentionShape) -> None:
        """Prepare for `attend` calls on `batch` (called once per forward)."""

    @abstractmethod
    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               batch: AttentionMetadata, scale: float) -> torch.Tensor:
        """Attention output (N, num_q_heads, head_dim) for the packed queries `q`."""
