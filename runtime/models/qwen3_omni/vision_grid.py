"""Patch grids of Qwen3-Omni's vision encoder: patchify, patch order, positions.

Patches are emitted in *merge-block order*: the image's grid of patches is cut into
m x m blocks (m = spatial_merge_size) and the m² patches of a block are consecutive, so
the patch merger can fold each block into one token with a reshape. `patchify` lays the
pixels out like Qwen2-VL's image processor (channel, temporal copy, row, column inside a
patch; a still image is repeated `temporal_patch_size` times).
"""
from __future__ import annotations

import torch
from torch.nn import functional as F


def resize_to_grid(image: torch.Tensor, unit: int) -> torch.Tensor:
    """(3, H, W) resized (bicubic) so that H and W are multiples of `unit` (at least one unit each)."""
    h, w = image.shape[-2:]
    size = (max(unit, round(h / unit) * unit), max(unit, round(w / unit) * unit))
    if size == (h, w):
        return image
    return F.interpolate(image[None], size=size, mode="bicubic", align_corners=False)[0]


def patchify(image: torch.Tensor, patch: int, merge: int, temporal: int) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """(3, H, W) -> patches (h·w, 3·temporal·patch·patch) in merge-block order, grid (1, h, w)."""
    c, height, width = image.shape
    h, w = height // patch, width // patch
    x = image.reshape(c, h // merge, merge, patch, w // merge, merge, patch)
    x = x.permute(1, 4, 2, 5, 0, 3, 6)  # (h/m, w/m, m, m, C, patch, patch)
    x = x[:, :, :, :, :, None].expand(*x.shape[:5], temporal, patch, patch)  # temporal copies
    return x.reshape(h * w, c * temporal * patch * patch), (1, h, w)


def patchify_frames(frames: torch.Tensor, patch: int, merge: int, temporal: int
                    ) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """(F, 3, H, W) video frames, F a multiple of `temporal` -> patches (t·h·w, 3·temporal·patch·patch) in
    merge-block order per temporal patch, grid (t, h, w) (the layout of Qwen2-VL's video processor)."""
    f, c, height, width = frames.shape
    t, h, w = f // temporal, height // patch, width // patch
    x = frames.reshape(t, temporal, c, h // merge, merge, patch, w // merge, merge, patch)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)  # (t, h/m, w/m, m, m, C, temporal, patch, patch)
    return x.reshape(t * h * w, c * temporal * patch * patch), (t, h, w)


def block_order_rows_cols(t: int, h: int, w: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(t·h·w,) row and column of each patch, in merge-block order, frames one after another."""
    rows = torch.arange(h).reshape(h // merge, merge, 1, 1).expand(h // merge, merge, w // merge, merge)
    cols = torch.arange(w).reshape(1, 1, w // merge, merge).expand(h // merge, merge, w // merge, merge)
    rows, cols = rows.permute(0, 2, 1, 3).flatten(), cols.permute(0, 2, 1, 3).flatten()
    return rows.repeat(t), cols.repeat(t)


def bilinear_taps(index: torch.Tensor, size: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two taps and weights per target index resampling `side` entries onto `size` (align_corners)."""
    src = index.float() * (side - 1) / max(size - 1, 1)
    floor = src.floor()
    taps = floor.long()[:, None] + torch.arange(2)  # (n, 2)
    weights = (1 - (src[:, None] - taps.float()).abs()).clamp(min=0)
    return taps.clamp(0, side - 1), weights


def position_taps(t: int, h: int, w: int, merge: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(t·h·w, 4) indices into a side x side learned position table and their bilinear weights."""
    rows, cols = block_order_rows_cols(t, h, w, merge)
    row_taps, row_weights = bilinear_taps(rows, h, side)
    col_taps, col_weights = bilinear_taps(cols, w, side)
    indices = (row_taps[:, :, None] * side + col_taps[:, None, :]).reshape(-1, 4)
    weights = (row_weights[:, :, None] * col_weights[:, None, :]).reshape(-1, 4)
    return indices, weights
