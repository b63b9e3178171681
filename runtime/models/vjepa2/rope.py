"""V-JEPA 2's 3-axis rotary position embedding (frame, row, column), shared by both kinds.

Each head's channels are split into three equal even-sized bands, rotated by the
token's frame, row and column index; leftover channels are not rotated (head_dim 64:
bands of 20, 4 channels left). Row/column indices are snapped to the model's training
grid (index * grid / tokens_per_side), which changes nothing at the native resolution.

The published checkpoints were trained with a quirk that this module reproduces on
purpose: channels are rotated in adjacent pairs (2i, 2i+1), but the angle tables are
the D/2 frequencies *concatenated twice* rather than repeated per pair, so pair i uses
frequency (2i mod D/2) for its first channel and (2i+1 mod D/2) for its second.
Changing it would break every released V-JEPA 2 checkpoint.

Conditioning tokens of the AC predictor (action, state) carry only a frame index; giving
them row = column = 0 rotates those bands by angle 0, i.e. leaves them unrotated, which
is exactly what V-JEPA 2-AC does.
"""
from __future__ import annotations

import torch


def axis_dim(head_dim: int) -> int:
    """Channels per rotated band: the largest even number <= head_dim / 3."""
    return 2 * ((head_dim // 3) // 2)


def _rotate_band(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """x (..., N, D) rotated by positions pos (..., N) broadcastable to x[..., 0]."""
    d = x.shape[-1]
    omega = 1.0 / 10000 ** (torch.arange(d // 2, dtype=torch.float32, device=x.device) / (d / 2))  # (D/2,)
    angle = pos.to(torch.float32)[..., None] * omega        # (..., N, D/2)
    cos = angle.cos().tile(2).to(x.dtype)                   # (..., N, D): [f0 .. f_{D/2-1}, f0 .. ]
    sin = angle.sin().tile(2).to(x.dtype)
    pairs = x.unflatten(-1, (-1, 2))                        # (..., N, D/2, 2)
    swapped = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)  # (-x1, x0, -x3, x2, ...)
    return x * cos + swapped * sin


def apply_rope_3d(x: torch.Tensor, frame: torch.Tensor, row: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """Rotate q or k (B, heads, N, head_dim) by per-token frame/row/col positions.

    Positions are float tensors of shape (N,) or (B, 1, N) (per-request frame offsets).
    """
    band = axis_dim(x.shape[-1])
    parts = [_rotate_band(x[..., i * band:(i + 1) * band], pos) for i, pos in enumerate((frame, row, col))]
    return torch.cat([*parts, x[..., 3 * band:]], dim=-1)


def grid_positions(num_frames: int, rows: int, cols: int, grid: int, device: torch.device | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(frame, row, col) float positions of num_frames x rows x cols patch tokens, row-major."""
    frame = torch.arange(num_frames, device=device, dtype=torch.float32).repeat_interleave(rows * cols)
    row = torch.arange(rows, device=device, dtype=torch.float32).repeat_interleave(cols).repeat(num_frames)
    col = torch.arange(cols, device=device, dtype=torch.float32).repeat(num_frames * rows)
    return frame, row * (grid / rows), col * (grid / cols)
