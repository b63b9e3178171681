"""The KV cache tensors of one model on one rank, in blocks.

Per layer, keys and values are (num_blocks, block_size, num_kv_heads, head_dim) —
FlashInfer's "NHD" layout of blocks, also read by the torch and triton backends. Which
request owns which block is the business of `KVBlockManager`; this class only stores,
writes and copies.

One block more than `num_blocks` is allocated: block `padding_block` belongs to no
request (the block managers hand out 0 .. num_blocks-1). The padding rows of a batch
padded up to a CUDA-graph bucket write their keys/values to `padding_slot` and read only
that block, so they never touch a real request's cache.
"""
from __future__ import annotations

from typing import Sequence

import torch


class PagedKVCache:
    """K and V blocks for `num_layers` layers."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        shape = (num_blocks + 1, block_size, num_kv_heads, head_dim)
        self.block_size = block_size
        self.num_blocks = num_blocks              # blocks a block manager may hand out
        self.padding_block = num_blocks           # the extra block padding rows write to
        self.padding_slot = num_blocks * block_size
        self.dtype = dtype
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
        return 2 * num_layers * block_size * num_kv_heads * head_dim * dtype_bytes

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Store new keys/values (N, kv_heads, head_dim) of `layer` at flat slots (N,); padding
        rows carry `padding_slot`."""
        self.k[layer].view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k.to(self.dtype))
        self.v[layer].view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v.to(self.dtype))

    def copy_blocks(self, copies: Sequence[tuple[int, int]]) -> None:
        """Apply copy-on-write copies (src block, dst block) from `KVBlockManager.append`."""
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], device=self.k[0].device)
        dst = torch.tensor([d for _, d in copies], device=self.k[0].device)
        for blocks in (*self.k, *self.v):
            blocks[dst] = blocks[src]
