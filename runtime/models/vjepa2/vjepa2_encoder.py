"""vjepa2_encoder: V-JEPA 2's video ViT, clip (B, F, 3, H, W) -> tokens (B, T, hidden).

A 3D convolution cuts the clip into tubelets (2 frames x 16 x 16 pixels), giving
T = F/2 * H/16 * W/16 tokens in (frame pair, row, column) order; pre-norm transformer
layers with 3-axis RoPE (runtime/models/vjepa2/rope.py) and no position table; a final
LayerNorm. Parameter names follow transformers' `VJEPA2Model` checkpoints
(`encoder.embeddings.patch_embeddings.proj.weight`, `encoder.layer.0.attention.query…`),
so the `encoder.*` part of a published checkpoint loads as is.

With `args.normalize_reps`, the output tokens are additionally layer-normed without
affine weights, as V-JEPA 2-AC's world model does before its predictor.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn
from torch.nn import functional as F

from runtime.models.vjepa2.layers import Mlp, merge_heads, split_heads
from runtime.models.vjepa2.rope import apply_rope_3d, grid_positions


class _PatchEmbeddings(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        kernel = (d["tubelet_size"], d["patch_size"], d["patch_size"])
        self.proj = nn.Conv3d(d["in_chans"], d["hidden_size"], kernel_size=kernel, stride=kernel)


class _Embeddings(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        self.tubelet_size = d["tubelet_size"]
        self.patch_embeddings = _PatchEmbeddings(d)

    def forward(self, video: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
        x = video.permute(0, 2, 1, 3, 4)                    # (B, 3, F, H, W)
        if x.shape[2] < self.tubelet_size:                  # a single image: repeat it into one tubelet
            x = x.repeat(1, 1, self.tubelet_size, 1, 1)
        x = self.patch_embeddings.proj(x.to(self.patch_embeddings.proj.weight.dtype))  # (B, hidden, t, h, w)
        grid = tuple(x.shape[2:])
        return x.flatten(2).transpose(1, 2), grid           # (B, t*h*w, hidden)


class _Attention(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        h = d["hidden_size"]
        self.num_heads = d["num_attention_heads"]
        self.query, self.key, self.value = (nn.Linear(h, h) for _ in range(3))
        self.proj = nn.Linear(h, h)

    def forward(self, x: torch.Tensor, pos: tuple[torch.Tensor, ...]) -> torch.Tensor:
        q = apply_rope_3d(split_heads(self.query(x), self.num_heads), *pos)  # (B, heads, T, D)
        k = apply_rope_3d(split_heads(self.key(x), self.num_heads), *pos)
        v = split_heads(self.value(x), self.num_heads)
        return self.proj(merge_heads(F.scaled_dot_product_attention(q, k, v)))


class _Layer(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        h, eps = d["hidden_size"], d["layer_norm_eps"]
        self.norm1 = nn.LayerNorm(h, eps=eps)
        self.attention = _Attention(d)
        self.norm2 = nn.LayerNorm(h, eps=eps)
        self.mlp = Mlp(h, d["intermediate_size"])

    def forward(self, x: torch.Tensor, pos: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), pos)
        return x + self.mlp(self.norm2(x))


class _Encoder(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        self.grid = d["image_size"] // d["patch_size"]
        self.embeddings = _Embeddings(d)
        self.layer = nn.ModuleList(_Layer(d) for _ in range(d["num_hidden_layers"]))
        self.layernorm = nn.LayerNorm(d["hidden_size"], eps=d["layer_norm_eps"])

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        x, (frames, rows, cols) = self.embeddings(video)
        pos = grid_positions(frames, rows, cols, self.grid, device=x.device)
        for layer in self.layer:
            x = layer(x, pos)
        return self.layernorm(x)


class Vjepa2Encoder(nn.Module):
    """The V-JEPA 2 video encoder node."""
    kind = "vjepa2_encoder"

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.normalize_reps = bool((args or {}).get("normalize_reps", False))
        self.tokens_per_frame = (dims["image_size"] // dims["patch_size"]) ** 2
        self.encoder = _Encoder(dims)

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        """video (B, F, 3, H, W) in model pixel space -> tokens (B, F/2 * H/p * W/p, hidden)."""
        x = self.encoder(video)
        return F.layer_norm(x, x.shape[-1:]) if self.normalize_reps else x
