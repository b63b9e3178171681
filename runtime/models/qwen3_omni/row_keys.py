"""What each KV row of the Qwen3-Omni thinker holds, as its prefix cache names it (runtime/model_executor/kv/prefix_cache.py).

A text row is its token id (an int, 4 bytes in the key, never negative). A row at an audio, image or
video placeholder that an encoder's output fills is a byte string:
  MEDIA  int32 -1 + digest of the row's embedding (16) + its M-RoPE (t, h, w) (12)
The leading -1 is no token id and the row's length is fixed, so a block's key bytes read back into
one row sequence only: text can never name a media row. The digest covers the row's embedding as the LM
takes it (dtype and width too), DeepStack columns included (runtime/models/qwen3_omni/thinker.py widens
them before a forward: DeepStack adds into the first layers' states at those rows, so it is part of their KV);
the positions cover the picture's grid, which the row count alone does not fix. Chained from the
prompt's first row, equal rows mean equal KV: a row's KV depends only on the rows up to it (the
thinker is causal), and each of those is named here.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Sequence

import torch

from runtime.model_executor.kv.prefix_cache import Row

MEDIA = (-1).to_bytes(4, "little", signed=True)


def media_rows(embeds: torch.Tensor, positions: torch.Tensor) -> list[bytes]:
    """Rows of one Run's embeds (M, width) at M placeholders whose (3, M) positions are given, each named
    by its own embedding: however a prompt's media are split into Runs (one utterance per Run, or a
    conversation's utterances in one), a row is named alike."""
    head = f"{embeds.dtype}{embeds.shape[1]}".encode()
    data = embeds.detach().cpu().contiguous().view(torch.uint8).numpy()         # (M, width * itemsize)
    return [MEDIA + hashlib.blake2b(head + row.tobytes(), digest_size=16).digest()
            + b"".join(int(p).to_bytes(4, "little", signed=True) for p in pos)
            for row, pos in zip(data, positions.T.tolist())]


def thinker_rows(tokens: Sequence[int], at: Sequence[int], embeds: torch.Tensor,
                 positions: torch.Tensor) -> list[Row]:
    """The Run's rows: its token ids, with media rows at the indices `at` that `embeds` (len(at), width)
    fill; `positions` (3, len(tokens)) are the rows' M-RoPE positions."""
    rows: list[Row] = list(tokens)
    for i, row in zip(at, media_rows(embeds, positions[:, list(at)])):
        rows[i] = row
    return rows


ROOT = b"\0" * 16        # the chain value before a request's first row


def chain_keys(previous: bytes, rows: Sequence[Row]) -> list[bytes]:
    """Each row's name together with every row before it (`previous`: the chain after those): equal keys,
    equal prefixes, so equal states at that row. A text row is its id as 4 bytes, a media row its bytes
    (module docstring), so the two cannot be confused."""
    keys = []
    for row in rows:
        previous = hashlib.blake2b(previous + (row if isinstance(row, bytes) else row.to_bytes(4, "little")),
                                   digest_size=16).digest()
        keys.append(previous)
    return keys


class TappedRows:
    """The thinker's layer-`accept_hidden_layer` states at media rows, by `chain_keys` key, for the last
    `max_rows` such rows computed: a Run that feeds a talker may reuse cached rows at media placeholders
    only where their states are here (the talker's prompt reads them; a reused row computes none)."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self._rows: OrderedDict[bytes, torch.Tensor] = OrderedDict()

    def __contains__(self, key: bytes) -> bool:
        return key in self._rows

    def get(self, key: bytes) -> torch.Tensor | None:
        row = self._rows.get(key)
        if row is not None:
            self._rows.move_to_end(key)
        return row

    def put(self, key: bytes, row: torch.Tensor) -> None:
        self._rows[key] = row
        self._rows.move_to_end(key)
        while len(self._rows) > self.max_rows:
            self._rows.popitem(last=False)
