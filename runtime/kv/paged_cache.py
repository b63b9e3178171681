"""The KV cache tensors of one model on one rank, in pages.

Per layer, keys and values are (num_blocks, block_size, num_kv_heads, head_dim) —
FlashInfer's "NHD" page layout, also read by the torch and triton backends. Which
request owns which block is the business of `KVBlockManager`; this class only stores,
writes and copies.
"""
from __future__ import annotations

from typing import Sequence

import torch


class PagedKVCache:
    """K and V pages for `num_layers` layers."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.dtype = dtype
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
        return 2 * num_layers * block_size * num_kv_heads * head_dim * dtype_bytes

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Store new keys/values (N, kv_heads, head_dim) of `layer` at flat slots (N,)."""
        self.k[layer].view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k.to(self.dtype))
        self.v[layer].view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v.to(self.dtype))

    def copy_blocks(self, copies: Sequence[tuple[int, int]]) -> None:
        """Apply copy-on-write copies (src block, dst block) from `KVBlockManager.append`."""
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], device=self.k[0].device)
        dst = torch.tensor([d for _, d in copies], device=self.k[0].device)
        for pages in (*self.k, *self.v):
            pages[dst] = pages[src]
