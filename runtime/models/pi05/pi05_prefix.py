"""pi05_prefix: π0.5's PaliGemma over its cameras and prompt, once per request: the prefix's keys and values.

Each camera image (3, S, S) in [-1, 1] goes through the SigLIP vision tower (patch convolution, learned
positions, pre-norm encoder layers, final LayerNorm) and the projector into `(S / patch)^2` rows of the LM's
width; those rows replace the prompt's image placeholders in order, the other tokens are embedded and scaled by
sqrt(width) (Gemma's scaled token embedding; the image rows are not), and the Gemma layers run over the whole
prefix with bidirectional attention, rows at positions 0.. T-1. What leaves the node is every layer's
rotated keys and values of every prefix row, one row of `kv_row_width` per token (layer 0's K, layer 0's
V, layer 1's K, ...): the last layer's MLP and the final norm are not needed for them and do not run
(their weights load all the same). A batch pads prompts to its longest under a key mask. Parameter names
follow transformers' `PaliGemmaModel` under π0.5 (`vision_tower.*`, `multi_modal_projector.linear`,
`language_model.*`); written here from its definition.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import nn

from runtime.models.bagel.siglip_vit import SiglipEncoderLayer
from runtime.models.pi05.gemma import GemmaMLP, GemmaProjections, GemmaRMSNorm, attend, rope_tables
from runtime.model_executor.layers.rotary import RotaryEmbedding
from runtime.model_executor.weights.fill import fill_weights


class _VisionEmbeddings(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        self.patch_embedding = nn.Conv2d(3, d["vision_hidden_size"], d["patch_size"], stride=d["patch_size"])
        self.position_embedding = nn.Embedding((d["image_size"] // d["patch_size"]) ** 2, d["vision_hidden_size"])

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(images.to(self.position_embedding.weight.dtype)).flatten(2).transpose(1, 2)
        return x + self.position_embedding.weight[None]


class _VisionEncoder(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        layer = {"hidden_size": d["vision_hidden_size"], "intermediate_size": d["vision_intermediate_size"],
                 "num_attention_heads": d["vision_num_attention_heads"], "layer_norm_eps": d["layer_norm_eps"]}
        self.layers = nn.ModuleList(SiglipEncoderLayer(layer) for _ in range(d["vision_num_hidden_layers"]))


class _VisionTower(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        self.embeddings = _VisionEmbeddings(d)
        self.encoder = _VisionEncoder(d)
        self.post_layernorm = nn.LayerNorm(d["vision_hidden_size"], eps=d["layer_norm_eps"])

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(N, 3, S, S) -> (N, patches, vision width)."""
        x = self.embeddings(images)
        n, patches, width = x.shape
        packed = x.reshape(n * patches, width)
        for layer in self.encoder.layers:
            packed = layer(packed, [patches] * n)
        return self.post_layernorm(packed).view(n, patches, width)


class _Projector(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        self.linear = nn.Linear(d["vision_hidden_size"], d["hidden_size"])


class _GemmaLayer(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        h = d["hidden_size"]
        self.self_attn = GemmaProjections(h, d["num_attention_heads"], d["num_key_value_heads"], d["head_dim"])
        self.mlp = GemmaMLP(h, d["intermediate_size"])
        self.input_layernorm = GemmaRMSNorm(h, d["rms_norm_eps"])
        self.post_attention_layernorm = GemmaRMSNorm(h, d["rms_norm_eps"])


class _LanguageModel(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(d["vocab_size"], d["hidden_size"])
        self.layers = nn.ModuleList(_GemmaLayer(d) for _ in range(d["num_hidden_layers"]))
        self.norm = GemmaRMSNorm(d["hidden_size"], d["rms_norm_eps"])


class Pi05Prefix(nn.Module):
    """Cameras + prompt -> the prefix's keys and values (module docstring)."""
    kind = "pi05_prefix"

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        args = dict(args or {})
        self.image_token_id = int(dims["image_token_id"])
        self.width = int(dims["hidden_size"])
        self.vision_tower = _VisionTower(dims)
        self.multi_modal_projector = _Projector(dims)
        self.language_model = _LanguageModel(dims)
        self.rotary = RotaryEmbedding(dims["head_dim"], float(dims["rope_theta"]))
        fill_weights(self, args)

    def image_rows(self, cameras: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each request's cameras (F, 3, S, S) -> its (F * patches, width) rows, all cameras in one call."""
        rows = self.multi_modal_projector.linear(self.vision_tower(torch.cat(list(cameras))))
        out, start = [], 0
        for c in cameras:
            out.append(rows[start:start + c.shape[0]].flatten(0, 1))
            start += c.shape[0]
        return out

    @torch.inference_mode()
    def forward(self, prompts: Sequence[torch.Tensor], cameras: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """prompts (T_i,) int64 with one placeholder per image row; cameras (F_i, 3, S, S) -> (T_i, kv_row_width)."""
        embed = self.language_model.embed_tokens
        device, dtype = embed.weight.device, embed.weight.dtype
        longest = max(int(p.numel()) for p in prompts)
        x = torch.zeros(len(prompts), longest, self.width, dtype=dtype, device=device)
        for b, (ids, rows) in enumerate(zip(prompts, self.image_rows([c.to(device) for c in cameras]))):
            ids = ids.to(device)
            placeholders = ids == self.image_token_id
            if int(placeholders.sum()) != rows.shape[0]:
                raise ValueError(f"a prompt holds {int(placeholders.sum())} image placeholders for "
                                 f"{rows.shape[0]} image rows")
            tokens = embed(ids.masked_fill(placeholders, 0)) * torch.tensor(self.width ** 0.5).to(dtype)
            x[b, :ids.numel()] = tokens.masked_scatter(placeholders[:, None], rows.to(dtype))
        lengths = torch.tensor([int(p.numel()) for p in prompts], device=device)
        key_mask = None if bool((lengths == longest).all()) else torch.arange(longest, device=device) < lengths[:, None]
        positions = torch.arange(longest, device=device).repeat(len(prompts), 1)
        cos, sin = rope_tables(self.rotary, positions, dtype)
        kv = []
        layers = self.language_model.layers
        for i, layer in enumerate(layers):
            q, k, v = layer.self_attn.qkv(layer.input_layernorm(x), cos, sin)
            kv += [k.transpose(1, 2).flatten(2), v.transpose(1, 2).flatten(2)]       # (B, T, kv * hd) each
            x = x + layer.self_attn.out(attend(q, k, v, key_mask))
            if i + 1 < len(layers):
                x = x + layer.mlp(layer.post_attention_layernorm(x))
        rows = torch.cat(kv, dim=-1)
        return [rows[b, :int(p.numel())] for b, p in enumerate(prompts)]
