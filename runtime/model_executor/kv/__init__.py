"""Paged KV cache: block allocation and tables (`KVBlockManager`: the conductor's, and a worker's for
the caches it decides itself), a worker's copy of the tables the conductor hands out (`BlockTables`),
content-addressed blocks for prefix caching (`PrefixCachingAllocator`) and the tensors (`PagedKVCache`)."""
from __future__ import annotations

from runtime.model_executor.kv.block_allocator import BlockAllocator, OutOfBlocks
from runtime.model_executor.kv.block_manager import BlockTable, KVBlockManager
from runtime.model_executor.kv.block_tables import BlockTables
from runtime.model_executor.kv.paged_cache import PagedKVCache
from runtime.model_executor.kv.prefix_cache import PrefixCachingAllocator, PrefixStats, chain_keys, prefix_root

__all__ = ["BlockAllocator", "BlockTable", "BlockTables", "KVBlockManager", "OutOfBlocks", "PagedKVCache",
           "PrefixCachingAllocator", "PrefixStats", "chain_keys", "prefix_root"]
