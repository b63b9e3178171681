"""Tensor parallelism: process groups and sharded linear / embedding layers (on CPU, their
weights packed for oneDNN once loaded: `pack_linears`)."""
from __future__ import annotations

from runtime.model_executor.parallel.cpu_linear import pack_linears
from runtime.model_executor.parallel.embedding import ParallelLMHead, VocabParallelEmbedding
from runtime.model_executor.parallel.group import SINGLE, TensorParallelGroup, init_tensor_parallel
from runtime.model_executor.parallel.linear import ColumnParallelLinear, RowParallelLinear

__all__ = [
    "pack_linears", "SINGLE", "TensorParallelGroup", "init_tensor_parallel",
    "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "ParallelLMHead",
]
