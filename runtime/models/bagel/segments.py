"""What one `bagel_mot_lm` call runs: a packed batch of *segments*, one per KV sequence.

A segment is the new rows of one KV sequence (a request's CFG branch) in one call, of one
of five kinds, exactly as BAGEL builds them:

  kind    rows                                   attention  experts          KV    RoPE positions
  TEXT    [bos] + prompt ids + [eos]             causal     und              write rope, rope+1, ...   (+n+2)
  DECODE  one token                              causal     und              write rope                (+1)
  VIT     [soi] + ViT embeds + [eoi]             full       und              write rope for all rows   (+1)
  VAE     [soi] + clean latent tokens + [eoi]    full       markers und,     write rope for all rows   (+1)
                                                            latents gen
  GEN     [soi] + noisy latent tokens + [eoi]    full       as VAE           none  rope for all rows   (+0)

"full" attention: every row sees the sequence's cached context and every row of its
own segment; "causal": the context and the rows before it. A GEN segment only reads the
cache (BAGEL's `update_past_key_values=False`), so the three CFG branches of a request
can run the same step side by side. A call holds at most one segment per KV sequence.

Latent tokens are p x p patches of the (C, h, w) latent (`runtime.models.bagel.patchify`), with
position ids on a max_latent_size-wide grid and the flow timestep (0 for VAE).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from itertools import accumulate
from typing import Sequence

import torch

from runtime.model_executor.attention import AttentionMetadata


class SegmentKind(str, Enum):
    TEXT = "text"
    DECODE = "decode"
    VIT = "vit"
    VAE = "vae"
    GEN = "gen"


@dataclass(frozen=True)
class Segment:
    """The new rows of one KV sequence in one call, and where that sequence stands."""

    kind: SegmentKind
    context_len: int                       # tokens already in this sequence's KV cache
    rope: int                              # this sequence's next RoPE position
    block_table: Sequence[int] = ()        # its cache blocks; must hold context_len + rows written
    tokens: torch.Tensor | None = None     # TEXT: prompt ids (n,) without bos/eos; DECODE: (1,)
    embeds: torch.Tensor | None = None     # VIT: (T, hidden_size) from `siglip_vit`
    latent: torch.Tensor | None = None     # VAE: clean latent; GEN: noisy latent x_t; (C, h, w)
    timestep: float = 0.0                  # GEN: the flow time t of `latent`

    @property
    def is_causal(self) -> bool:
        return self.kind in (SegmentKind.TEXT, SegmentKind.DECODE)

    @property
    def writes_kv(self) -> bool:
        return self.kind is not SegmentKind.GEN

    def num_rows(self, patch: int) -> int:
        if self.kind is SegmentKind.TEXT:
            return len(self.tokens) + 2
        if self.kind is SegmentKind.DECODE:
            return 1
        if self.kind is SegmentKind.VIT:
            return self.embeds.shape[0] + 2
        _, h, w = self.latent.shape
        return (h // patch) * (w // patch) + 2

    def advanced(self, patch: int) -> tuple[int, int]:
        """(context_len, rope) of this sequence after the call."""
        written = self.num_rows(patch) if self.writes_kv else 0
        if self.is_causal:
            return self.context_len + written, self.rope + written
        return self.context_len + written, self.rope + (1 if self.writes_kv else 0)


@dataclass(frozen=True)
class SegmentLayout:
    """Row ranges and cache addressing of a packed call (shared by all layers)."""

    starts: tuple[int, ...]            # first row of each segment
    lengths: tuple[int, ...]           # rows of each segment
    context_lens: tuple[int, ...]      # cached tokens each segment attends to besides its own rows
    # joint attention only (empty when causal_metadata is set):
    context_slots: tuple[torch.Tensor, ...]  # per segment (context_len,) flat cache slots of its context
    masks: tuple[torch.Tensor | None, ...]   # per segment (rows, context + rows) causal mask; None: full
    write_rows: torch.Tensor           # (W,) rows whose keys/values go into the cache
    slot_mapping: torch.Tensor         # (W,) their flat cache slots
    causal_metadata: AttentionMetadata | None  # set when every segment is causal and writes: paged backends apply

    @property
    def num_rows(self) -> int:
        return sum(self.lengths)


def _slots(table: Sequence[int], start: int, n: int, block_size: int) -> list[int]:
    if -(-(start + n) // block_size) > len(table):
        raise ValueError(f"a block table of {len(table)} blocks of {block_size} cannot hold "
                         f"{start + n} tokens: append blocks before the call")
    return [table[p // block_size] * block_size + p % block_size for p in range(start, start + n)]


def _causal_mask(context: int, n: int, device: torch.device | str) -> torch.Tensor | None:
    if n == 1:
        return None
    keys = torch.arange(context + n, device=device)
    return keys[None, :] <= torch.arange(context, context + n, device=device)[:, None]


def _joint_addressing(segments: Sequence[Segment], lengths: Sequence[int], block_size: int,
                      device: torch.device | str) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor | None, ...]]:
    """Context slots and masks of each segment, for `joint_attention.attend_segments`."""
    slots = tuple(torch.tensor(_slots(seg.block_table, 0, seg.context_len, block_size), dtype=torch.long,
                               device=device) for seg in segments)
    masks = tuple(_causal_mask(seg.context_len, n, device) if seg.is_causal else None
                  for seg, n in zip(segments, lengths))
    return slots, masks


def layout_segments(segments: Sequence[Segment], patch: int, block_size: int,
                    device: torch.device | str = "cpu") -> SegmentLayout:
    """Row ranges, written rows and their slots; the paged-backend metadata when it applies,
    else the context slots and masks of the joint attention."""
    lengths = [seg.num_rows(patch) for seg in segments]
    starts = [0, *accumulate(lengths)][:-1]
    write_rows, slots = [], []
    for seg, start, n in zip(segments, starts, lengths):
        if seg.writes_kv:
            write_rows.extend(range(start, start + n))
            slots.extend(_slots(seg.block_table, seg.context_len, n, block_size))
    metadata, context_slots, masks = None, (), ()
    if segments and all(seg.is_causal for seg in segments):
        tables = [tuple(int(b) for b in seg.block_table) for seg in segments]
        metadata = AttentionMetadata.build(
            lengths, [seg.context_len + n for seg, n in zip(segments, lengths)], tables, block_size, device)
    else:
        context_slots, masks = _joint_addressing(segments, lengths, block_size, device)
    return SegmentLayout(
        starts=tuple(starts), lengths=tuple(lengths),
        context_lens=tuple(seg.context_len for seg in segments),
        context_slots=context_slots, masks=masks,
        write_rows=torch.tensor(write_rows, dtype=torch.long, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        causal_metadata=metadata,
    )
