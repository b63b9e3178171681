"""Patch packing shared by BAGEL's ViT input and its latent tokens.

BAGEL packs a (C, H, W) array into tokens of p x p pixels of every channel, in the order
einsum("chpwq->hwpqc"): token (i, j) row-major, inside a token (py, px, c). Position ids
are flattened on a fixed grid of `max_per_side` columns ("extrapolate" mode), so a
token's id depends only on its (row, column), not on the image size.
"""
from __future__ import annotations

import torch


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """(C, H, W) -> (H/p * W/p, p*p*C)."""
    c, h, w = x.shape
    if h % p or w % p:
        raise ValueError(f"array of size {h}x{w} is not a multiple of the patch size {p}")
    x = x.reshape(c, h // p, p, w // p, p)  # (C, h, p, w, p)
    return torch.einsum("chpwq->hwpqc", x).reshape(-1, p * p * c)


def unpatchify(tokens: torch.Tensor, h: int, w: int, p: int) -> torch.Tensor:
    """(h/p * w/p, p*p*C) -> (C, h, w): the inverse of `patchify`."""
    c = tokens.shape[-1] // (p * p)
    x = tokens.reshape(h // p, w // p, p, p, c)  # (h, w, p, p, C)
    return torch.einsum("hwpqc->chpwq", x).reshape(c, h, w)


def grid_position_ids(rows: int, cols: int, max_per_side: int) -> torch.Tensor:
    """Position ids of a rows x cols token grid on a max_per_side-wide table: (rows*cols,)."""
    if rows > max_per_side or cols > max_per_side:
        raise ValueError(f"a {rows}x{cols} token grid exceeds the {max_per_side}x{max_per_side} table")
    return (torch.arange(rows)[:, None] * max_per_side + torch.arange(cols)).flatten()
