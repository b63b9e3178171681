"""Prefix-cache counters per (rank, KV node) on /metrics, read from the conductor's KV ledger.

The ledger owns every block table and decides every reuse (runtime/conductor/kv_ledger.py), so it
counts them itself: lookups of a new request's prompt (or of a piece of it: BAGEL looks up each text or
picture segment of each CFG branch), lookups that reused at least one block, prompt rows looked up and
reused, and cached blocks evicted to make room. A pool several nodes share is shown under the node it
is kept under (`NodeInfo.kv_pool`).
"""
from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily

from runtime.conductor.kv_ledger import KVLedger

_COUNTERS = (
    ("queries", "mstar_prefix_cache_queries", "prompts looked up in the prefix cache"),
    ("hits", "mstar_prefix_cache_hits", "prompts that reused at least one cached KV block"),
    ("query_tokens", "mstar_prefix_cache_query_tokens", "prompt tokens looked up in the prefix cache"),
    ("hit_tokens", "mstar_prefix_cache_hit_tokens", "prompt tokens reused from the prefix cache (not computed)"),
    ("evictions", "mstar_prefix_cache_evictions", "cached KV blocks evicted (least recently freed first)"),
)


class PrefixCacheCollector:
    """Counters read from the ledger when /metrics is scraped (none while no pool caches prefixes)."""

    def __init__(self, ledger: KVLedger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[CounterMetricFamily]:
        stats = sorted(self.ledger.prefix_stats().items())
        for field, name, doc in _COUNTERS:
            family = CounterMetricFamily(name, doc, labels=["rank", "node"])
            for (rank, node), s in stats:
                family.add_metric([str(rank), node], getattr(s, field))
            yield family
