"""Tensor parallelism: process groups and sharded linear / embedding layers."""
from __future__ import annotations

from runtime.parallel.embedding import ParallelLMHead, VocabParallelEmbedding
from runtime.parallel.group import SINGLE, TensorParallelGroup, init_tensor_parallel
from runtime.parallel.linear import ColumnParallelLinear, RowParallelLinear

__all__ = [
    "SINGLE", "TensorParallelGroup", "init_tensor_parallel",
    "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "ParallelLMHead",
]
