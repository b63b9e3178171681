"""`DecodeInputs`: the static device buffers a captured decode step reads, and how a batch is padded into them.

A CUDA graph replays kernels with the tensor addresses seen at capture, so every input
of a decode step lives in one buffer allocated once, sized for the largest bucket;
bucket b reads the first b rows. `fill` writes a batch of n <= b decode requests into
rows 0..n-1 and pads rows n..b-1 with inputs that touch no request: token 0 at
position 0, seq_len 1, a block table pointing only at the cache's padding block, and
the padding slot as the place to write their key/value.
"""
from __future__ import annotations

from typing import Sequence

import torch

from runtime.model_executor.attention import AttentionMetadata
from runtime.model_executor.kv import PagedKVCache


class DecodeInputs:
    """Static inputs of decode steps of up to `max_batch` requests with up to `max_blocks` blocks each."""

    def __init__(self, cache: PagedKVCache, max_batch: int, max_blocks: int) -> None:
        device = cache.k[0].device
        self.cache, self.max_batch, self.max_blocks = cache, max_batch, max_blocks
        # rows: token id, position, slot of each request (one host->device copy per step)
        self.rows = torch.zeros(3, max_batch, dtype=torch.long, device=device)
        self.rows[2].fill_(cache.padding_slot)
        self.seq_lens = torch.ones(max_batch, dtype=torch.int32, device=device)
        self.block_tables = torch.full((max_batch, max_blocks), cache.padding_block, dtype=torch.int32,
                                       device=device)
        self.query_start_loc = torch.arange(max_batch + 1, dtype=torch.int32, device=device)

    def input_ids(self, bucket: int) -> torch.Tensor:
        return self.rows[0, :bucket]

    def positions(self, bucket: int) -> torch.Tensor:
        return self.rows[1, :bucket]

    def fits(self, block_tables: Sequence[Sequence[int]], seq_lens: Sequence[int]) -> bool:
        """Whether a batch with these tables and lengths fits the buffers."""
        size = self.cache.block_size
        return len(seq_lens) <= self.max_batch and all(-(-s // size) <= self.max_blocks for s in seq_lens)

    def fill(self, bucket: int, tokens: Sequence[int], block_tables: Sequence[Sequence[int]],
             seq_lens: Sequence[int]) -> AttentionMetadata:
        """Write decode requests (one new token each; `seq_lens` counts it) padded to `bucket`; their metadata."""
        size, pad = self.cache.block_size, bucket - len(tokens)
        used = tuple(tuple(int(b) for b in t[:-(-s // size)]) for t, s in zip(block_tables, seq_lens))
        rows = torch.tensor([
            [*tokens, *(0,) * pad],
            [*(s - 1 for s in seq_lens), *(0,) * pad],
            [*(t[(s - 1) // size] * size + (s - 1) % size for t, s in zip(used, seq_lens)),
             *(self.cache.padding_slot,) * pad]], dtype=torch.long)                      # (3, bucket)
        lengths = (*(int(s) for s in seq_lens), *(1,) * pad)
        width = max((len(t) for t in used), default=1)
        padding = self.cache.padding_block
        table = torch.tensor([[*t, *(padding,) * (width - len(t))] for t in used] + [[padding] * width] * pad,
                             dtype=torch.int32)                                             # (bucket, width)
        # columns past `width` keep stale entries: the kernels never read past a row's seq_len
        self.rows[:, :bucket].copy_(rows)
        self.seq_lens[:bucket].copy_(torch.tensor(lengths, dtype=torch.int32))
        self.block_tables[:bucket, :width].copy_(table)
        return self.metadata(bucket, lengths, used + ((self.cache.padding_block,),) * pad)

    def metadata(self, bucket: int, seq_lens: tuple[int, ...],
                 block_tables: tuple[tuple[int, ...], ...]) -> AttentionMetadata:
        """Metadata over the static buffers' first `bucket` rows, with these host copies."""
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[:bucket + 1], seq_lens=self.seq_lens[:bucket],
            block_tables=self.block_tables[:bucket], slot_mapping=self.rows[2, :bucket],
            block_size=self.cache.block_size, query_lens_cpu=(1,) * bucket, seq_lens_cpu=seq_lens,
            block_tables_cpu=block_tables)
