"""Paged KV cache: block allocation and tables (`KVBlockManager`) and the tensors (`PagedKVCache`)."""
from __future__ import annotations

from runtime.kv.block_allocator import BlockAllocator, OutOfBlocks
from runtime.kv.block_manager import BlockTable, KVBlockManager
from runtime.kv.paged_cache import PagedKVCache

__all__ = ["BlockAllocator", "BlockTable", "KVBlockManager", "OutOfBlocks", "PagedKVCache"]
