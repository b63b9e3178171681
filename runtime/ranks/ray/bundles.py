"""What each rank asks a cluster for, and which ranks must land on one node.

A rank is one device (DESIGN: one worker process per GPU, or per configured CPU rank), so
it asks for one GPU when the cluster has any, `cpus` CPUs for its torch threads, and the
host memory of its weights (plus its KV pools when they live in host memory, on CPU).
A tensor-parallel group runs collectives every layer, so its ranks are packed onto one
node (Ray's STRICT_PACK); the other ranks follow the operator's strategy.
Torch-free and Ray-free: the compiler's plan in, plain numbers out.
"""
from __future__ import annotations

from dataclasses import dataclass

from mstar_compiler.plan import Plan

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")   # Ray's placement-group strategies


@dataclass(frozen=True)
class RankResources:
    """One rank's bundle."""

    rank: int
    num_cpus: float
    num_gpus: int
    memory_bytes: int       # host memory: weights (and KV pools on a CPU rank)

    def bundle(self) -> dict[str, float]:
        """The Ray bundle (a resource name -> amount); GPU only when asked for."""
        out = {"CPU": self.num_cpus, "memory": float(self.memory_bytes)}
        return {**out, "GPU": float(self.num_gpus)} if self.num_gpus else out


@dataclass(frozen=True)
class PackGroup:
    """Ranks reserved together in one placement group."""

    ranks: tuple[int, ...]
    strategy: str
    is_tensor_parallel: bool


def tp_groups(plan: Plan) -> list[tuple[int, ...]]:
    """The plan's tensor-parallel groups (rank tuples), in rank order."""
    groups = {tuple(ranks) for node in plan.nodes if node.placement.tp_size > 1
              for ranks in (node.placement.ranks, *node.placement.walk_ranks.values())}
    return sorted(groups)


def rank_resources(plan: Plan, num_cpus: float, has_gpus: bool) -> list[RankResources]:
    if num_cpus <= 0:
        raise ValueError(f"CPUs per rank must be positive, got {num_cpus}")
    return [RankResources(rank=r.index, num_cpus=num_cpus, num_gpus=1 if has_gpus else 0,
                          memory_bytes=r.weight_bytes + (0 if has_gpus else r.kv_bytes)) for r in plan.ranks]


def pack_groups(plan: Plan, strategy: str = "PACK") -> list[PackGroup]:
    """One STRICT_PACK group per tensor-parallel group, then one group of every other rank
    placed by `strategy`."""
    if strategy not in STRATEGIES:
        raise ValueError(f"placement strategy {strategy!r} is none of {', '.join(STRATEGIES)}")
    tp = tp_groups(plan)
    overlapping = [r for r in range(len(plan.ranks)) if sum(r in g for g in tp) > 1]
    if overlapping:
        raise ValueError(f"ranks {overlapping} are in several tensor-parallel groups {tp}; a worker joins one")
    groups = [PackGroup(g, "STRICT_PACK", True) for g in tp]
    free = tuple(r.index for r in plan.ranks if not any(r.index in g for g in tp))
    return groups + ([PackGroup(free, strategy, False)] if free else [])
