"""The conductor's count of KV blocks per (rank, KV node), mirroring the workers' block tables.

A worker's `KVBlockManager` holds ceil(tokens / block_size) blocks per request (no forks
across requests yet), so counting tokens here tells exactly whether its next allocation
fits: the conductor only dispatches work that fits, and a worker never runs out.
Paired verbs: `can_grow` / `grow` / `free`.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class KvPoolLedger:
    """One KV pool: capacity and tokens held per request."""

    num_blocks: int
    block_size: int
    tokens: dict[int, int] = field(default_factory=dict)   # request id -> tokens in the cache
    peak_blocks: int = 0                                     # most blocks ever held at once
    used_blocks: int = 0                                     # blocks held now: the sum over `tokens`

    def _blocks(self, n: int) -> int:
        return -(-n // self.block_size)

    def needed(self, request_id: int, n_new: int) -> int:
        held = self.tokens.get(request_id, 0)
        return self._blocks(held + n_new) - self._blocks(held)

    def fits_alone(self, request_id: int, n_new: int) -> bool:
        """Whether the request's cache after growing fits the pool at all (with nobody else in it)."""
        return self._blocks(self.tokens.get(request_id, 0) + n_new) <= self.num_blocks

    def can_grow(self, request_id: int, n_new: int, reserved: int = 0) -> bool:
        return self.needed(request_id, n_new) + reserved <= self.num_blocks - self.used_blocks

    def grow(self, request_id: int, n_new: int) -> None:
        self.used_blocks += self.needed(request_id, n_new)
        self.tokens[request_id] = self.tokens.get(request_id, 0) + n_new
        self.peak_blocks = max(self.peak_blocks, self.used_blocks)

    def free(self, request_id: int) -> None:
        self.used_blocks -= self._blocks(self.tokens.pop(request_id, 0))

    def clear(self) -> None:
        self.tokens.clear()
        self.used_blocks = 0

    def holders(self) -> list[int]:
        return list(self.tokens)


class KvLedger:
    """Every KV pool of the plan, keyed by (rank, node)."""

    def __init__(self) -> None:
        self.pools: dict[tuple[int, str], KvPoolLedger] = {}

    def add_pool(self, rank: int, node: str, num_blocks: int, block_size: int) -> None:
        self.pools[(rank, node)] = KvPoolLedger(num_blocks, block_size)

    def pool(self, rank: int, node: str) -> KvPoolLedger | None:
        return self.pools.get((rank, node))

    def free_request(self, request_id: int) -> None:
        for pool in self.pools.values():
            pool.free(request_id)

    def free_rank(self, rank: int) -> None:
        for (r, _), pool in self.pools.items():
            if r == rank:
                pool.clear()

    def usage(self) -> float:
        """Fraction of all KV blocks in use."""
        total = sum(p.num_blocks for p in self.pools.values())
        return 0.0 if total == 0 else sum(p.used_blocks for p in self.pools.values()) / total

    def peak_usage(self) -> float:
        """The highest fraction of its blocks any one pool ever held."""
        return max((p.peak_blocks / p.num_blocks for p in self.pools.values() if p.num_blocks), default=0.0)
