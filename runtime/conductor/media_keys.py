"""What the KV rows of a media input item's placeholders hold, named where the request's inputs are known.

The conductor keys a pool's full blocks by their rows (runtime/conductor/kv_ledger.py): a text row by its
token id, and, in a pool whose executor declares `kv_media_ids` (the Qwen3-Omni thinker's audio, image and
video pads), a placeholder row of a Run whose tokens stand for a media item (`MediaInput`) by that item:
  MEDIA  int32 -1 + digest of the medium (16) + the row's index among its placeholders (4)
The leading -1 is no token id and the row's length is fixed, so text can never name a media row. The
digest covers everything the server hands the encoder: the item's kind and every field of it but its ids
(a waveform's or picture's dtype, shape and bytes after the server's decoding and resize, a picture's
M-RoPE grid and frame step). An item holding several media (`MediaInput.parts`: a realtime conversation's
utterances, as rows already encoded) names each part alone, so the next turn's history, one item with one
more utterance, names the earlier ones as the turn before did. What the plan fixes (the encoder's weights,
its featuriser) is in the pool's root key. Chained from the prompt's first row, equal rows mean equal KV: a
row's KV depends only on the rows up to it (the LM is causal) and an encoder's output for a medium only on
the medium. So a chat's second turn about a picture it sent before reuses the picture's blocks from its
first Run, and admission charges only the blocks it really takes, before any worker has run an encoder.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Sequence

import torch

from runtime.conductor.request import MediaInput, SizedInput
from runtime.model_executor.kv.prefix_cache import Row, tensor_digest
from runtime.model_executor.kv.run_rows import Medium

MEDIA = (-1).to_bytes(4, "little", signed=True)


def _digest(item: MediaInput | SizedInput, value: torch.Tensor) -> bytes:
    h = hashlib.blake2b(type(item).__name__.encode(), digest_size=16)
    for f in dataclasses.fields(item):
        if f.name not in ("value", "tokens", "parts"):
            h.update(f.name.encode() + b"=" + repr(getattr(item, f.name)).encode())
    h.update(b"value=" + (tensor_digest(value) if isinstance(value, torch.Tensor) else repr(value).encode()))
    return h.digest()


def media_names(item: MediaInput | SizedInput) -> list[tuple[bytes, int]]:
    """(digest, placeholders) of each medium of the item (module docstring): the whole item (-1: all its
    placeholders), or each of its `parts`, a slice of the value's rows. A `SizedInput` (BAGEL's picture,
    whose rows its family lays out: runtime/models/bagel/row_keys.py) is one medium."""
    if isinstance(item, SizedInput) or not item.parts:
        return [(_digest(item, item.value), -1)]
    names, start = [], 0
    for rows in item.parts:
        names.append((_digest(item, item.value[start:start + rows]), rows))
        start += rows
    return names


def media_rows(tokens: Sequence[int], media_ids: frozenset[int], names: Sequence[tuple[bytes, int]]) -> list[Row]:
    """A Run's `tokens` as the cache keys them when they stand for the media `names` (`media_names`): each
    placeholder (an id in `media_ids`) named by its medium and its index there, every other row its id."""
    rows: list[Row] = list(tokens)
    part, index = 0, 0
    for i, token in enumerate(tokens):
        if token not in media_ids:
            continue
        while part + 1 < len(names) and index == names[part][1]:
            part, index = part + 1, 0
        rows[i] = MEDIA + names[part][0] + index.to_bytes(4, "little")
        index += 1
    return rows


def run_rows(tokens: Sequence[int], item: MediaInput | None, media_ids: frozenset[int],
             names: Sequence[tuple[bytes, int]] | None = None) -> Sequence[Row]:
    """The rows of a Run whose tokens are `tokens`, read from input `item` (None: not a media item): its
    placeholders named by the item (`names`: its `media_names`, if taken already) when the Run's tokens are
    exactly the item's (a recompute that re-sends a history holding several items keeps its ids, and its
    placeholders stop the keying)."""
    if item is None or not media_ids or list(tokens) != list(item.tokens):
        return tokens
    return media_rows(tokens, media_ids, media_names(item) if names is None else names)


def medium(item: MediaInput | SizedInput, names: Sequence[tuple[bytes, int]] | None = None) -> Medium | None:
    """A picture or waveform input item as a family's row rule reads it (`Family.kv_rows`): its digest (the
    first of `names`, its `media_names` if taken already) and its value's shape; None for another value."""
    if not isinstance(item.value, torch.Tensor):
        return None
    return Medium((media_names(item) if names is None else names)[0][0], tuple(item.value.shape))


__all__ = ["MEDIA", "media_names", "media_rows", "medium", "run_rows"]
