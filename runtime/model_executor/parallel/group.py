"""The tensor-parallel group a module's shards belong to, and its two collectives.

A `TensorParallelGroup` of size 1 (`SINGLE`) needs no process group and its collectives
are no-ops, so single-device code never touches `torch.distributed`. Larger groups wrap a
`torch.distributed` process group: gloo on CPU, NCCL on CUDA.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TensorParallelGroup:
    """Who this process is among the ranks that shard one module."""

    rank: int = 0                                       # index of this shard, 0 <= rank < size
    size: int = 1                                       # number of shards
    group: dist.ProcessGroup | None = None              # None: the default (world) group

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank {self.rank} is outside a group of size {self.size}")

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the group, in place; returns it."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's `x` along the last axis, in rank order."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)

    def shard(self, total: int, what: str) -> int:
        """The per-rank size of an axis of `total` that must split evenly."""
        if total % self.size:
            raise ValueError(f"{what} = {total} does not split over tensor-parallel size {self.size}")
        return total // self.size


SINGLE = TensorParallelGroup()


def init_tensor_parallel(rank: int, size: int, init_method: str, backend: str | None = None) -> TensorParallelGroup:
    """Join a tensor-parallel group of `size` processes (the whole world) and return it.

    `init_method` is a torch.distributed URL, e.g. ``tcp://127.0.0.1:29500``; `backend`
    defaults to NCCL when CUDA is available, else gloo.
    """
    if size == 1:
        return SINGLE
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size)
    return TensorParallelGroup(rank=rank, size=size)
