"""What each KV row of a BAGEL segment holds, as the prefix cache names it (runtime/model_executor/kv/prefix_cache.py).

A row is a self-delimiting byte string: a tag, then a fixed-size payload.
  TEXT    b"t" + first-row flag + token id (4 bytes)   [bos] + prompt ids + [eos]
  DECODE  b"d" + token id (4 bytes)
  VIT     b"v" + digest of the ViT embeddings (16) + row index (4)   [soi] + rows + [eoi]
  VAE     b"a" + digest of the clean latent (16) + row index (4)     [soi] + rows + [eoi]
Chained from the sequence's first row, equal rows mean equal KV: positions follow from the
segments before (TEXT advances RoPE by its rows, an image by one), experts from the kinds, and
an image's rows from its digest. The digest is of the encoder's output itself (bytes, dtype and
shape), so two requests share an image's KV exactly when its encoded rows are bit-equal: the
same image bytes through the same resize give the same rows, and nothing can match by mistake.
"""
from __future__ import annotations

import torch

from runtime.model_executor.kv.prefix_cache import tensor_digest
from runtime.models.bagel.segments import SegmentKind


def _token(t: int) -> bytes:
    return int(t).to_bytes(4, "little", signed=True)


def text_rows(tokens: list[int], bos: int, eos: int) -> list[bytes]:
    ids = [bos, *tokens, eos]
    return [b"t" + (b"\x01" if i == 0 else b"\x00") + _token(t) for i, t in enumerate(ids)]


def decode_rows(token: int) -> list[bytes]:
    return [b"d" + _token(token)]


def image_rows(kind: SegmentKind, source: torch.Tensor, num_rows: int) -> list[bytes]:
    """Rows of a VIT (source: embeds) or VAE (source: clean latent) segment of `num_rows` rows."""
    prefix = (b"v" if kind is SegmentKind.VIT else b"a") + tensor_digest(source)
    return [prefix + i.to_bytes(4, "little") for i in range(num_rows)]
