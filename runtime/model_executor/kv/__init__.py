"""Paged KV cache: block allocation and tables (`KVBlockManager`), content-addressed blocks for
prefix caching (`PrefixCachingAllocator`) and the tensors (`PagedKVCache`)."""
from __future__ import annotations

from runtime.model_executor.kv.block_allocator import BlockAllocator, OutOfBlocks
from runtime.model_executor.kv.block_manager import BlockTable, KVBlockManager, PrefixOutOfStep
from runtime.model_executor.kv.paged_cache import PagedKVCache
from runtime.model_executor.kv.prefix_cache import PrefixCachingAllocator, PrefixStats, chain_keys, prefix_root

__all__ = ["BlockAllocator", "BlockTable", "KVBlockManager", "OutOfBlocks", "PagedKVCache",
           "PrefixCachingAllocator", "PrefixOutOfStep", "PrefixStats", "chain_keys", "prefix_root"]
