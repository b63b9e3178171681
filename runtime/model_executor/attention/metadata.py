"""`AttentionMetadata`: where each token of a packed, mixed batch lives in the paged KV cache.

One forward call runs B requests packed into N = sum(query_lens) token rows, no padding:
request b owns rows [query_start_loc[b], query_start_loc[b+1]). Request b has
seq_lens[b] tokens in the cache *after* this call (its context plus its query_lens[b]
new tokens), so its new tokens sit at positions seq_lens[b] - query_lens[b] + i. A
decoding request has query_len 1; a prefill chunk has query_len > 1 and may follow
earlier chunks (context > 0). Keys/values of request b at position p live in cache block
block_tables[b, p // block_size], offset p % block_size; slot_mapping[n] is the flat slot
(block * block_size + offset) where new token row n's key/value is written.

Host copies of the lengths ride along so backends can plan launches without reading
device memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class AttentionMetadata:
    """Layout of one packed batch; built once per forward and shared by all layers."""

    query_start_loc: torch.Tensor          # (B+1,) int32: cumulative query lengths, [0] = 0, [B] = N
    seq_lens: torch.Tensor                 # (B,) int32: cached tokens per request after this step
    block_tables: torch.Tensor             # (B, max_blocks) int32: cache blocks of each request, 0-padded
    slot_mapping: torch.Tensor             # (N,) int64: flat cache slot of each new token row
    block_size: int                        # tokens per cache block
    query_lens_cpu: tuple[int, ...]        # host copy of the per-request query lengths
    seq_lens_cpu: tuple[int, ...]          # host copy of seq_lens
    block_tables_cpu: tuple[tuple[int, ...], ...]  # host copy of the used part of each block table

    @property
    def num_requests(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens_cpu)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens_cpu, default=0)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_cpu, default=0)

    @property
    def is_decode_only(self) -> bool:
        return all(q == 1 for q in self.query_lens_cpu)

    def last_token_rows(self) -> torch.Tensor:
        """(B,) row index of each request's last new token (where its next token is sampled)."""
        return self.query_start_loc[1:].long() - 1

    @classmethod
    def build(cls, query_lens: Sequence[int], seq_lens: Sequence[int],
              block_tables: Sequence[Sequence[int]], block_size: int,
              device: torch.device | str = "cpu") -> AttentionMetadata:
        """Metadata for requests with these query lengths, cached lengths and block lists."""
        _check(query_lens, seq_lens, block_tables, block_size)
        used = tuple(tuple(int(b) for b in t[:-(-s // block_size)]) for t, s in zip(block_tables, seq_lens))
        starts = [0]
        for q in query_lens:
            starts.append(starts[-1] + q)
        width = max((len(t) for t in used), default=0) or 1
        table = torch.tensor([t + (0,) * (width - len(t)) for t in used], dtype=torch.int32).view(len(used), width)
        slots = [t[p // block_size] * block_size + p % block_size
                 for t, q, s in zip(used, query_lens, seq_lens) for p in range(s - q, s)]
        return cls(
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(list(seq_lens), dtype=torch.int32, device=device),
            block_tables=table.to(device),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            block_size=block_size,
            query_lens_cpu=tuple(int(q) for q in query_lens),
            seq_lens_cpu=tuple(int(s) for s in seq_lens),
            block_tables_cpu=used,
        )


def _check(query_lens: Sequence[int], seq_lens: Sequence[int],
           block_tables: Sequence[Sequence[int]], block_size: int) -> None:
    if not len(query_lens) == len(seq_lens) == len(block_tables):
        raise ValueError(f"{len(query_lens)} query lengths, {len(seq_lens)} sequence lengths and "
                         f"{len(block_tables)} block tables: one of each per request")
    for b, (q, s, t) in enumerate(zip(query_lens, seq_lens, block_tables)):
        if not 1 <= q <= s:
            raise ValueError(f"request {b}: query length {q} must be in [1, seq_len={s}]")
        if len(t) * block_size < s:
            raise ValueError(f"request {b}: {len(t)} blocks of {block_size} cannot hold {s} tokens")
