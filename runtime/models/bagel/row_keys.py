"""The KV rows each Run of a BAGEL LM node writes, as the conductor counts and keys them (`Family.kv_rows`).

The conductor owns the tables of BAGEL's LM cache (runtime/conductor/kv_ledger.py): one pool per rank for
the node and its `same_as` CFG branches, each branch of a request a table of its own. What a Run writes
follows from its walk's segment kind (runtime/models/bagel/roles.py) and is named row by row, a
self-delimiting key of a tag and a fixed-size payload:
  TEXT    b"t" + first-row flag + token id (4 bytes)   [bos] + prompt ids + [eos]
  DECODE  the token id (an int, as every LM's decode row)
  VIT     b"v" + the picture's digest (16) + row index (4)   [soi] + the ViT's patches + [eoi]
  VAE     b"a" + the picture's digest (16) + row index (4)   [soi] + the latent's tokens + [eoi]
  GEN     nothing (a generation step only reads the cache)
Chained from the sequence's first row, equal rows mean equal KV: positions follow from the segments
before (TEXT advances RoPE by its rows, a picture by one), experts from the kinds, and a picture's rows
from the picture, named by the digest the conductor takes of the request's input item (the server's
decoded, resized pixels: runtime/conductor/media_keys.py), since the encoders' output follows from it
and the plan's weights (the pool's root key). So the rows of a picture, and a CFG branch's context equal
to another's, are known to be cached before any encoder runs, and admission charges only new blocks.
A TEXT, VIT or VAE segment is reused whole or computed whole (`KVRows.whole`): an image's rows attend
to each other, and a segment always starts at its first row.
"""
from __future__ import annotations

from typing import Any, Mapping

from mstar_compiler.plan import Node, Plan
from runtime.model_executor.kv.run_rows import KVRowRule, KVRows, KVRun
from runtime.models.bagel.generation import image_stride, vae_resize, vit_resize
from runtime.models.bagel.image_io import target_size
from runtime.models.bagel.roles import segment_kinds
from runtime.models.bagel.segments import SegmentKind


def _token(t: int) -> bytes:
    return int(t).to_bytes(4, "little", signed=True)


def text_rows(tokens: list[int], bos: int, eos: int) -> list[bytes]:
    ids = [bos, *tokens, eos]
    return [b"t" + (b"\x01" if i == 0 else b"\x00") + _token(t) for i, t in enumerate(ids)]


def image_rows(kind: SegmentKind, digest: bytes, num_rows: int) -> list[bytes]:
    """Rows of a VIT or VAE segment of `num_rows` rows (markers included) of the picture `digest` names."""
    prefix = (b"v" if kind is SegmentKind.VIT else b"a") + digest
    return [prefix + i.to_bytes(4, "little") for i in range(num_rows)]


def encoder_rows(plan: Plan, height: int, width: int) -> dict[SegmentKind, int]:
    """The rows each encoder computes from an (H, W) input picture, after its own resize: the VAE's latent
    tokens and the ViT's patches (markers not included)."""
    lm = next(n.dims for n in plan.nodes if n.kind == "bagel_mot_lm")
    stride = image_stride(lm)
    w, h = target_size(width, height, vae_resize(lm))
    rows = {SegmentKind.VAE: (h // stride) * (w // stride)}
    vit = next((n.dims for n in plan.nodes if n.kind == "siglip_vit"), None)
    if vit is not None:
        w, h = target_size(width, height, vit_resize(vit))
        rows[SegmentKind.VIT] = (h // vit["patch_size"]) * (w // vit["patch_size"])
    return rows


def _rows(plan: Plan, kinds: Mapping[str, SegmentKind], dims: Mapping[str, Any], run: KVRun) -> KVRows:
    kind = kinds.get(run.walk, SegmentKind.TEXT)
    if kind is SegmentKind.GEN:
        return KVRows(0)
    if kind is SegmentKind.DECODE:   # the answer starts from BAGEL's <|im_start|>
        return KVRows(1, list(run.tokens[-1:]) or [dims["bos_token_id"]])
    if kind is SegmentKind.TEXT:
        return KVRows(len(run.tokens) + 2, text_rows(list(run.tokens), dims["bos_token_id"], dims["eos_token_id"]),
                      whole=True)
    if run.medium is None:
        raise ValueError(f"a {kind.value} Run of walk {run.walk!r} reads no picture of the request")
    count = encoder_rows(plan, run.medium.shape[0], run.medium.shape[1])[kind] + 2
    return KVRows(count, image_rows(kind, run.medium.digest, count), whole=True)


def bagel_kv_rows(plan: Plan, node: Node) -> KVRowRule:
    """The rule the conductor counts and keys a BAGEL LM node's Runs by (module docstring)."""
    kinds, dims = segment_kinds(plan, node.name), node.dims
    return lambda run: _rows(plan, kinds, dims, run)


__all__ = ["bagel_kv_rows", "encoder_rows", "image_rows", "text_rows"]
