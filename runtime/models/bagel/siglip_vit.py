"""Component `siglip_vit`: SigLIP vision tower + BAGEL's connector, image -> LLM embeddings.

BAGEL runs SigLIP so400m/14 without its last layer, on native-resolution images (sides
multiples of 14, see `runtime.models.bagel.image_io.VIT_RESIZE`), with learned position
embeddings looked up by flattened (row, column) ids on a 70 x 70 grid. The tower's
output goes through an MLP connector (fc1, GELU-tanh, fc2) into the LLM width, plus a
frozen 2-D sin-cos position table `vit_pos_embed`.

Parameter names are BAGEL's checkpoint names (`vit_model.vision_model.embeddings...`,
`vit_model.vision_model.encoder.layers.N...`, `connector.fc1`, `vit_pos_embed.pos_embed`).
As in BAGEL's checkpoint the patch embedding is a Linear over patchified pixels; an HF
SigLIP Conv2d weight converts with `conv_patch_weight_to_linear`.

A batch is a list of images of any sizes: every linear layer runs once over all their
tokens packed together; attention stays inside each image.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from runtime.models.bagel.embeddings import PositionEmbedding
from runtime.models.bagel.patchify import grid_position_ids, patchify
from runtime.models.bagel.weights import init_weights, seeded


def conv_patch_weight_to_linear(weight: torch.Tensor) -> torch.Tensor:
    """HF SigLIP Conv2d patch weight (D, C, p, p) -> BAGEL's Linear weight (D, p*p*C)."""
    return weight.permute(0, 2, 3, 1).reshape(weight.shape[0], -1)


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     seqlens: Sequence[int]) -> torch.Tensor:
    """Bidirectional attention inside each segment of packed (N, heads, head_dim) tensors. Each segment goes in
    as a batch of one, (1, heads, T, head_dim): the CPU's fused (flash) SDPA kernel takes 4-D inputs only, and a
    3-D call falls back to the math path, which materialises every (T, T) score matrix."""
    out = []
    for qs, ks, vs in zip(q.split(list(seqlens)), k.split(list(seqlens)), v.split(list(seqlens))):
        o = F.scaled_dot_product_attention(*(t.transpose(0, 1)[None] for t in (qs, ks, vs)))
        out.append(o[0].transpose(0, 1))  # (T, heads, head_dim)
    return torch.cat(out)


class SiglipAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden)
        self.out_proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, seqlens: Sequence[int]) -> torch.Tensor:
        shape = (x.shape[0], self.heads, -1)  # (N, heads, head_dim)
        q, k, v = (proj(x).view(shape) for proj in (self.q_proj, self.k_proj, self.v_proj))
        return self.out_proj(packed_attention(q, k, v, seqlens).reshape(x.shape))


class SiglipMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, intermediate)
        self.fc2 = nn.Linear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class SiglipEncoderLayer(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        hidden, eps = d["hidden_size"], d["layer_norm_eps"]
        self.layer_norm1 = nn.LayerNorm(hidden, eps=eps)
        self.self_attn = SiglipAttention(hidden, d["num_attention_heads"])
        self.layer_norm2 = nn.LayerNorm(hidden, eps=eps)
        self.mlp = SiglipMLP(hidden, d["intermediate_size"])

    def forward(self, x: torch.Tensor, seqlens: Sequence[int]) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x), seqlens)
        return x + self.mlp(self.layer_norm2(x))


class SiglipEmbeddings(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        patch_in = d["num_channels"] * d["patch_size"] ** 2
        self.patch_embedding = nn.Linear(patch_in, d["hidden_size"])
        self.position_embedding = nn.Embedding(d["max_num_patch_per_side"] ** 2, d["hidden_size"])

    def forward(self, patches: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return self.patch_embedding(patches) + self.position_embedding(position_ids)


class SiglipEncoder(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(SiglipEncoderLayer(d) for _ in range(d["num_hidden_layers"]))


class SiglipVisionTransformer(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        self.embeddings = SiglipEmbeddings(d)
        self.encoder = SiglipEncoder(d)
        self.post_layernorm = nn.LayerNorm(d["hidden_size"], eps=d["layer_norm_eps"])

    def forward(self, patches: torch.Tensor, position_ids: torch.Tensor,
                seqlens: Sequence[int]) -> torch.Tensor:
        x = self.embeddings(patches, position_ids)
        for layer in self.encoder.layers:
            x = layer(x, seqlens)
        return self.post_layernorm(x)


class SiglipVisionModel(nn.Module):
    """The tower under BAGEL's name `vit_model` (HF's SiglipVisionModel layout, no head)."""

    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        self.vision_model = SiglipVisionTransformer(d)


class MLPConnector(nn.Module):
    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_dim, out_dim)
        self.fc2 = nn.Linear(out_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class SiglipVit(nn.Module):
    """Images -> per-image LLM-width embeddings (one row per 14 x 14 patch)."""
    kind = "siglip_vit"

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any]) -> None:
        super().__init__()
        self.patch_size = dims["patch_size"]
        self.max_per_side = dims["max_num_patch_per_side"]
        with seeded(int(args.get("seed", 0))):
            self.vit_model = SiglipVisionModel(dims)
            self.connector = MLPConnector(dims["hidden_size"], dims["llm_hidden_size"])
        self.vit_pos_embed = PositionEmbedding(self.max_per_side, dims["llm_hidden_size"])
        init_weights(self, args, fixed=("vit_pos_embed.pos_embed",))

    def position_ids(self, image: torch.Tensor) -> torch.Tensor:
        """Flattened grid ids of an image's patches: (T,)."""
        rows, cols = image.shape[-2] // self.patch_size, image.shape[-1] // self.patch_size
        return grid_position_ids(rows, cols, self.max_per_side)

    def tower(self, images: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """The SigLIP tower alone: packed (sum T, vit_hidden), position ids, tokens per image."""
        dtype = self.vit_model.vision_model.embeddings.patch_embedding.weight.dtype
        patches = torch.cat([patchify(img.to(dtype), self.patch_size) for img in images])
        device = patches.device
        position_ids = torch.cat([self.position_ids(img) for img in images]).to(device)
        seqlens = [(img.shape[-2] // self.patch_size) * (img.shape[-1] // self.patch_size) for img in images]
        return self.vit_model.vision_model(patches, position_ids, seqlens), position_ids, seqlens

    @torch.inference_mode()
    def forward(self, images: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """images: (3, H, W) each in [-1, 1], H and W multiples of patch_size.

        Returns one (T_i, llm_hidden_size) tensor per image, T_i = H/14 * W/14.
        """
        hidden, position_ids, seqlens = self.tower(images)
        embeds = self.connector(hidden) + self.vit_pos_embed(position_ids)
        return list(embeds.split(seqlens))
