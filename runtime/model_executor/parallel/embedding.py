"""Vocabulary-parallel token embedding and LM head.

Rank r holds rows [r*shard, (r+1)*shard) of the (vocab, hidden) table, shard =
ceil(vocab / tp); the last shard is zero-padded. The embedding looks up the ids it owns
and all-reduces (other ranks contribute zeros); the head computes its slice of the
logits and all-gathers them, dropping the padding.

On CPU the head packs its table in panels (runtime.model_executor.parallel.cpu_linear; one copy): a tied
embedding then gathers its rows from the head's panels, and `columns` computes a range of the logits
(Orpheus' audio slots) on the panels of that range only.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.model_executor.kernels import cpu as cpu_kernels
from runtime.model_executor.parallel.cpu_linear import Packed, dense_gone, linear, pack_weight
from runtime.model_executor.parallel.group import SINGLE, TensorParallelGroup


class VocabParallelEmbedding(nn.Module):
    """Token id -> embedding row, with the table split over the group by vocabulary."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TensorParallelGroup = SINGLE) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        self.shard = -(-vocab_size // tp.size)
        self.start = tp.rank * self.shard
        self.weight = nn.Parameter(torch.empty(self.shard, hidden_size))
        self.panels: torch.Tensor | None = None    # the table as a tied LM head packed it (its only copy then)

    def rows(self, local: torch.Tensor) -> torch.Tensor:
        """Rows of this rank's table by local index."""
        if self.panels is None:
            return F.embedding(local, self.weight)
        return cpu_kernels.panel_rows(self.panels, local, self.weight.shape[1])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return self.rows(ids)
        local = ids - self.start
        owned = (local >= 0) & (local < self.shard)
        out = self.rows(torch.where(owned, local, 0))  # (N, hidden)
        out = out * owned.unsqueeze(-1).to(out.dtype)
        return self.tp.all_reduce(out)

    @torch.no_grad()
    def load_weight(self, part: int, full: torch.Tensor) -> None:
        """Copy this rank's rows of the full (vocab, hidden) table; padding rows become 0."""
        rows = full[self.start:self.start + self.shard]
        self.weight.zero_()
        self.weight[:rows.shape[0]].copy_(rows)


class ParallelLMHead(nn.Module):
    """hidden -> logits over the full vocabulary; may share the embedding's table (tied)."""

    def __init__(self, embedding: VocabParallelEmbedding, tied: bool) -> None:
        super().__init__()
        self.tp = embedding.tp
        self.vocab_size = embedding.vocab_size
        self.tied = tied
        if tied:
            self._embedding = [embedding]  # a list keeps the shared table out of this module's parameters
        else:
            self.weight = nn.Parameter(torch.empty_like(embedding.weight))
            self.start, self.shard = embedding.start, embedding.shard
        self.packed: Packed | None = None     # packed copy of the table (runtime.model_executor.parallel.cpu_linear)

    def table(self) -> torch.Tensor:
        return self._embedding[0].weight if self.tied else self.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = linear(hidden, self.table(), None, self.packed)  # (M, shard)
        return self.tp.all_gather_last(logits)[..., :self.vocab_size]

    def columns(self, hidden: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """Logits of this rank's table rows lo .. hi - 1 only."""
        if self.packed is None:
            return F.linear(hidden, self.table()[lo:hi])
        return cpu_kernels.gemm_columns(hidden, self.packed, lo, hi)

    def rows(self, local: torch.Tensor) -> torch.Tensor:
        """Rows of this rank's table by local index."""
        if self.tied:
            return self._embedding[0].rows(local)
        if self.packed is None:
            return self.weight[local]
        return cpu_kernels.panel_rows(self.packed, local, self.weight.shape[1])

    def pack_for_cpu(self) -> int:
        """The table in panels, its dense copy gone (module doc); a tied embedding reads its rows from them."""
        table = self.table()
        if table.device.type == "meta":      # packed already
            return 0
        self.packed = pack_weight(table, rows_read=True)
        if self.packed is None:
            return 0
        if self.tied:
            self._embedding[0].panels = self.packed
            self._embedding[0].weight = dense_gone(table)
        else:
            self.weight = dense_gone(table)
        return 1

    @torch.no_grad()
    def load_weight(self, part: int, full: torch.Tensor) -> None:
        rows = full[self.start:self.start + self.shard]
        self.weight.zero_()
        self.weight[:rows.shape[0]].copy_(rows)
