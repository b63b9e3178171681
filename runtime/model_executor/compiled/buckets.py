"""Batch buckets: which batch sizes a node's decode step is captured for, and which one a batch uses.

The compiler's capture pass lists, per capture region (a loop body of capture-safe nodes
on one rank), the buckets 1, 2, 4, ..., max_batch. A batch of n requests runs in the
smallest bucket >= n, padded with rows that touch no request's state; a batch larger
than every bucket runs eagerly.
"""
from __future__ import annotations

from typing import Sequence

from mstar_compiler.plan import Plan


def capture_buckets(plan: Plan, node: str, rank: int) -> tuple[int, ...]:
    """Sorted batch buckets of every capture region of `plan` that runs `node` on `rank` (() if none)."""
    sizes = {b for region in plan.capture_regions if node in region.nodes and region.rank == rank
             for b in region.batch_buckets}
    return tuple(sorted(sizes))


def bucket_for(num_requests: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket that holds `num_requests` (sorted `buckets`), None when none does."""
    return next((b for b in buckets if b >= num_requests), None) if num_requests > 0 else None
