"""qwen3_omni_vision_encoder: Qwen3-Omni's ViT, image -> merged patch tokens plus DeepStack taps.

  image (3, H, W) in [-1, 1] -> resized to multiples of patch·merge -> patches in
  merge-block order (runtime/models/qwen3_omni/vision_grid.py) -> Conv3d patch embedding +
  bilinearly resampled learned positions -> ViT blocks with 2-D rotary embeddings,
  attention inside each image -> `merger` folds every m x m block into one thinker-width
  token; after the blocks listed in `deepstack_visual_indexes` a `merger_list` entry does
  the same to that block's output (DeepStack: the thinker adds those to its first layers).
Weight names are the checkpoint's `thinker.visual.*` less the prefix (the graph's mapping strips it).

    hidden, deepstack = encoder.encode_patches(patches, grids)   # packed, as transformers
    outputs = encoder(images)                                    # [(hidden (T, out), deepstack (D, T, out))]
    outputs = encoder.encode_pixels(pixels)                      # processed (3, H, W) or (F, 3, H, W) frames
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from runtime.models.qwen3_omni.rope import apply_rope
from runtime.models.qwen3_omni.vision_grid import (block_order_rows_cols, patchify, patchify_frames, position_taps,
                                                    resize_to_grid)
from runtime.models.qwen3_omni.weights import CheckpointWeights, initialise


class _Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        s, length, dim = x.shape
        q, k, v = self.qkv(x).view(s, length, 3, self.num_heads, -1).unbind(2)  # (S, L, heads, D) each
        q, k = apply_rope(q.float(), cos, sin).to(x.dtype), apply_rope(k.float(), cos, sin).to(x.dtype)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=key_mask[:, None, None, :])
        return self.proj(out.transpose(1, 2).reshape(s, length, dim))


class _MLP(nn.Module):
    def __init__(self, dim: int, inner: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(dim, inner)
        self.linear_fc2 = nn.Linear(inner, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate="tanh"))


class _Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, inner: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = _Attention(dim, num_heads)
        self.mlp = _MLP(dim, inner)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, key_mask)
        return x + self.mlp(self.norm2(x))


class _Merger(nn.Module):
    """LayerNorm (per patch, or per merged block when `postshuffle`), then a 2-layer GELU MLP."""

    def __init__(self, dim: int, merge: int, out: int, postshuffle: bool) -> None:
        super().__init__()
        self.wide, self.postshuffle = dim * merge * merge, postshuffle
        self.ln_q = nn.LayerNorm(self.wide if postshuffle else dim, eps=1e-6)
        self.mlp = nn.ModuleList([nn.Linear(self.wide, self.wide), nn.GELU(), nn.Linear(self.wide, out)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln_q(x.reshape(-1, self.wide)) if self.postshuffle else self.ln_q(x).reshape(-1, self.wide)
        for layer in self.mlp:
            x = layer(x)
        return x


class _PatchEmbed(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        self.kernel = (d["temporal_patch_size"], d["patch_size"], d["patch_size"])
        self.channels, self.dim = d["in_channels"], d["hidden_size"]
        self.proj = nn.Conv3d(self.channels, self.dim, self.kernel, stride=self.kernel)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        x = patches.view(-1, self.channels, *self.kernel).to(self.proj.weight.dtype)  # (N, C, t, p, p)
        return self.proj(x).view(-1, self.dim)


class Qwen3OmniVisionEncoder(CheckpointWeights, nn.Module):
    kind = "qwen3_omni_vision_encoder"

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        h, m, out = dims["hidden_size"], dims["spatial_merge_size"], dims["out_hidden_size"]
        self.patch, self.merge, self.temporal = dims["patch_size"], m, dims["temporal_patch_size"]
        self.head_dim, self.theta = h // dims["num_heads"], float(dims["rope_theta"])
        self.side = int(dims["num_position_embeddings"] ** 0.5)
        self.deepstack_layers = tuple(dims["deepstack_visual_indexes"])
        self.merger_list = nn.ModuleList(_Merger(h, m, out, True) for _ in self.deepstack_layers)
        self.patch_embed = _PatchEmbed(dims)
        self.pos_embed = nn.Embedding(dims["num_position_embeddings"], h)
        self.blocks = nn.ModuleList(_Block(h, dims["num_heads"], dims["intermediate_size"])
                                    for _ in range(dims["depth"]))
        self.merger = _Merger(h, m, out, False)
        initialise(self.hf_slots(), args or {})

    def forward(self, images: Sequence[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Images (3, H_i, W_i) in [-1, 1] -> per image (hidden (T_i, out), deepstack (D, T_i, out))."""
        pieces = [patchify(resize_to_grid(im, self.patch * self.merge), self.patch, self.merge, self.temporal)
                  for im in images]
        grids = torch.tensor([grid for _, grid in pieces])
        hidden, deepstack = self.encode_patches(torch.cat([p for p, _ in pieces]), grids)
        sizes = [int(t * hh * ww) // self.merge ** 2 for t, hh, ww in grids.tolist()]
        return list(zip(hidden.split(sizes), deepstack.split(sizes, dim=1)))

    def encode_pixels(self, pixels: Sequence[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Processed pixels (runtime/models/qwen3_omni/vision_inputs.py): per item a still image (3, H, W)
        or video frames (F, 3, H, W), sides multiples of patch·merge
        -> (hidden (T_i, out), deepstack (D, T_i, out))."""
        pieces = [patchify_frames(p if p.dim() == 4 else p[None].expand(self.temporal, *p.shape),
                                  self.patch, self.merge, self.temporal) for p in pixels]
        grids = torch.tensor([grid for _, grid in pieces])
        hidden, deepstack = self.encode_patches(torch.cat([p for p, _ in pieces]), grids)
        sizes = [int(t * hh * ww) // self.merge ** 2 for t, hh, ww in grids.tolist()]
        return list(zip(hidden.split(sizes), deepstack.split(sizes, dim=1)))

    def encode_patches(self, patches: torch.Tensor, grids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed patches (N, C·t·p·p) of frames with grids (B, 3) -> hidden (N/m², out), deepstack (D, N/m², out)."""
        x = self.patch_embed(patches) + self._positions(grids).to(patches.dtype)
        frames = [hh * ww for t, hh, ww in grids.tolist() for _ in range(t)]
        segments = x.split(frames)
        width = max(frames)
        x = torch.stack([F.pad(s, (0, 0, 0, width - s.shape[0])) for s in segments])  # (frames, width, hidden)
        key_mask = torch.arange(width)[None, :] < torch.tensor(frames)[:, None]
        cos, sin = self._rotary(grids, frames, width)
        taps = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, key_mask)
            if i in self.deepstack_layers:
                taps.append(self.merger_list[self.deepstack_layers.index(i)](x[key_mask]))
        return self.merger(x[key_mask]), torch.stack(taps)

    def _positions(self, grids: torch.Tensor) -> torch.Tensor:
        """(N, hidden) learned positions resampled to each frame's grid."""
        parts = []
        for t, h, w in grids.tolist():
            indices, weights = position_taps(t, h, w, self.merge, self.side)
            parts.append((self.pos_embed(indices.to(self.pos_embed.weight.device)) * weights[..., None]).sum(1))
        return torch.cat(parts)

    def _rotary(self, grids: torch.Tensor, frames: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (frames, width, head_dim): row angles on the first quarter lanes, column angles on the second."""
        quarter = self.head_dim // 2
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, quarter, 2, dtype=torch.float32) / quarter))
        angles = []
        for t, h, w in grids.tolist():
            rows, cols = block_order_rows_cols(1, h, w, self.merge)
            per_frame = torch.cat((rows[:, None] * inv_freq, cols[:, None] * inv_freq), dim=-1)  # (h·w, D/2)
            angles += [per_frame] * t
        angles = torch.stack([F.pad(a, (0, 0, 0, width - a.shape[0])) for a in angles])
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos(), angles.sin()
