"""zimage_dit: Z-Image's single-stream diffusion transformer (one denoising step of a batch of requests).

Each request brings its latent (C, H, W), its timestep t in [0, 1] (1: pure noise) and its caption's
text-encoder rows (T, cap_feat_dim); the model returns its output for the latent (the Z-Image sampler
steps with its negation). The latent is cut into 2x2 patches, each sequence padded to a multiple of 32
rows (the padding rows become learned pad tokens, as upstream), the image rows refined under the
timestep's modulation, the caption rows refined without it, then [image, caption] run through the main
layers with 3-axis RoPE (caption rows at (1 + i, 0, 0), image rows at (caption + 1, h, w)); requests of
different sizes share a call, padded with a key mask. Parameter names follow diffusers'
`ZImageTransformer2DModel` (`all_x_embedder.2-1`, `layers.N.attention.to_q`, `adaLN_modulation.0`, ...),
so the published `transformer/` checkpoint loads as is; written here from its definition.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from runtime.model_executor.layers.norm import RMSNorm
from runtime.model_executor.weights.fill import fill_weights

ADALN_DIM = 256          # the timestep embedding's width (at most)
SEQ_MULTIPLE = 32        # every sequence is padded to a multiple of this many rows
PATCH = 2                # 2x2 latent patches, one frame


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        head_dim = dim // heads
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.to_out = nn.ModuleList([nn.Linear(dim, dim, bias=False)])
        self.norm_q, self.norm_k = RMSNorm(head_dim, 1e-5), RMSNorm(head_dim, 1e-5)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, rope: torch.Tensor) -> torch.Tensor:
        q = _rotate(self.norm_q(self.to_q(x).unflatten(-1, (self.heads, -1))), rope)
        k = _rotate(self.norm_k(self.to_k(x).unflatten(-1, (self.heads, -1))), rope)
        v = self.to_v(x).unflatten(-1, (self.heads, -1))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=None if mask is None else mask[:, None, None, :])
        return self.to_out[0](out.transpose(1, 2).flatten(2))


def _rotate(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """x (B, L, heads, D) rotated by the complex (B, L, D/2) `rope`, in fp32, pairs of adjacent lanes."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * rope.unsqueeze(2)).flatten(3).type_as(x)


class _FeedForward(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        hidden = int(dim / 3 * 8)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class _Block(nn.Module):
    def __init__(self, d: Mapping[str, Any], modulation: bool) -> None:
        super().__init__()
        dim, eps = d["dim"], d["norm_eps"]
        self.attention = _Attention(dim, d["n_heads"])
        self.feed_forward = _FeedForward(dim)
        self.attention_norm1, self.ffn_norm1 = RMSNorm(dim, eps), RMSNorm(dim, eps)
        self.attention_norm2, self.ffn_norm2 = RMSNorm(dim, eps), RMSNorm(dim, eps)
        self.modulation = modulation
        if modulation:
            self.adaLN_modulation = nn.Sequential(nn.Linear(min(dim, ADALN_DIM), 4 * dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, rope: torch.Tensor,
                t: torch.Tensor | None = None) -> torch.Tensor:
        if not self.modulation:
            x = x + self.attention_norm2(self.attention(self.attention_norm1(x), mask, rope))
            return x + self.ffn_norm2(self.feed_forward(self.ffn_norm1(x)))
        scale_attn, gate_attn, scale_ffn, gate_ffn = self.adaLN_modulation(t).unsqueeze(1).chunk(4, dim=2)
        x = x + gate_attn.tanh() * self.attention_norm2(self.attention(self.attention_norm1(x) * (1 + scale_attn),
                                                                       mask, rope))
        return x + gate_ffn.tanh() * self.ffn_norm2(self.feed_forward(self.ffn_norm1(x) * (1 + scale_ffn)))


class _FinalLayer(nn.Module):
    def __init__(self, dim: int, out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, out)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(min(dim, ADALN_DIM), dim))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        scale = 1 + self.adaLN_modulation(t).unsqueeze(1)
        return self.linear(F.layer_norm(x, x.shape[-1:], eps=1e-6) * scale)


class _TimestepEmbedder(nn.Module):
    def __init__(self, out: int, mid: int = 1024, frequencies: int = 256) -> None:
        super().__init__()
        self.frequencies = frequencies
        self.mlp = nn.Sequential(nn.Linear(frequencies, mid), nn.SiLU(), nn.Linear(mid, out))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.frequencies // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        args = t[:, None].float() * freqs[None]
        return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1).to(self.mlp[0].weight.dtype))


class _Rope:
    """Per-axis complex rotations (theta 256) of integer positions (L, 3) -> (L, head_dim / 2)."""

    def __init__(self, dims: Sequence[int], lens: Sequence[int], theta: float) -> None:
        self.tables = []
        for d, n in zip(dims, lens):
            inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
            angles = torch.outer(torch.arange(n, dtype=torch.float64), inv).float()
            self.tables.append(torch.polar(torch.ones_like(angles), angles))

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.cat([table.to(ids.device)[ids[:, i]] for i, table in enumerate(self.tables)], dim=-1)


def _grid(size: tuple[int, int, int], start: tuple[int, int, int]) -> torch.Tensor:
    axes = [torch.arange(s0, s0 + n, dtype=torch.long) for s0, n in zip(start, size)]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).flatten(0, 2)


def _padded(rows: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Rows and position ids padded to a multiple of SEQ_MULTIPLE (the last row repeated, ids (0, 0, 0));
    the count of real rows."""
    n, pad = rows.shape[0], -rows.shape[0] % SEQ_MULTIPLE
    if pad:
        rows = torch.cat([rows, rows[-1:].expand(pad, -1)])
        ids = torch.cat([ids, torch.zeros(pad, 3, dtype=torch.long)])
    return rows, ids, n


class ZImageDiT(nn.Module):
    """The Z-Image denoiser node (module docstring)."""
    kind = "zimage_dit"

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        dim, channels = dims["dim"], dims["in_channels"]
        self.channels = channels
        self.t_scale = float(dims["t_scale"])
        patch = PATCH * PATCH * channels
        self.all_x_embedder = nn.ModuleDict({f"{PATCH}-1": nn.Linear(patch, dim)})
        self.all_final_layer = nn.ModuleDict({f"{PATCH}-1": _FinalLayer(dim, patch)})
        self.noise_refiner = nn.ModuleList(_Block(dims, True) for _ in range(dims["n_refiner_layers"]))
        self.context_refiner = nn.ModuleList(_Block(dims, False) for _ in range(dims["n_refiner_layers"]))
        self.t_embedder = _TimestepEmbedder(min(dim, ADALN_DIM))
        self.cap_embedder = nn.Sequential(RMSNorm(dims["cap_feat_dim"], dims["norm_eps"]),
                                          nn.Linear(dims["cap_feat_dim"], dim))
        self.x_pad_token = nn.Parameter(torch.zeros(1, dim))
        self.cap_pad_token = nn.Parameter(torch.zeros(1, dim))
        self.layers = nn.ModuleList(_Block(dims, True) for _ in range(dims["n_layers"]))
        self.rope = _Rope(dims["axes_dims"], dims["axes_lens"], float(dims["rope_theta"]))
        fill_weights(self, dict(args or {}))

    def _sequence(self, rows: list[torch.Tensor], ids: list[torch.Tensor], real: list[int], pad_token: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Padding rows replaced by `pad_token`, then the batch padded: (B, L, dim), (B, L, hd/2) rope, mask."""
        rows = [torch.where((torch.arange(r.shape[0], device=r.device) >= n)[:, None], pad_token, r)
                for r, n in zip(rows, real)]
        return _batch(rows, [self.rope(i.to(r.device)) for r, i in zip(rows, ids)])

    def forward(self, latents: list[torch.Tensor], t: torch.Tensor, caps: list[torch.Tensor]) -> list[torch.Tensor]:
        """latents [(C, H, W)], t (B,) in [0, 1], caps [(T, cap_feat_dim)] -> the model's output [(C, H, W)]."""
        t_emb = self.t_embedder(t * self.t_scale).type_as(latents[0])
        images, image_ids, image_real, caps_in, cap_ids, cap_real = [], [], [], [], [], []
        for latent, cap in zip(latents, caps):
            cap_rows, ids, n = _padded(cap, _grid((cap.shape[0] + -cap.shape[0] % SEQ_MULTIPLE, 1, 1), (1, 0, 0)))
            caps_in.append(cap_rows)
            cap_ids.append(ids[:cap_rows.shape[0]])
            cap_real.append(n)
            c, h, w = latent.shape
            patches = latent.view(c, 1, 1, h // PATCH, PATCH, w // PATCH, PATCH).permute(1, 3, 5, 2, 4, 6, 0)
            patches = patches.reshape(h * w // PATCH ** 2, PATCH * PATCH * c)
            rows, ids, n = _padded(patches, _grid((1, h // PATCH, w // PATCH), (cap_rows.shape[0] + 1, 0, 0)))
            images.append(rows)
            image_ids.append(ids)
            image_real.append(n)
        embed = self.all_x_embedder[f"{PATCH}-1"]
        x, x_rope, x_mask = self._sequence([embed(r) for r in images], image_ids, image_real, self.x_pad_token)
        for block in self.noise_refiner:
            x = block(x, x_mask, x_rope, t_emb)
        c, c_rope, c_mask = self._sequence([self.cap_embedder(r) for r in caps_in], cap_ids, cap_real,
                                           self.cap_pad_token)
        for block in self.context_refiner:
            c = block(c, c_mask, c_rope)
        x_lens, c_lens = [r.shape[0] for r in images], [r.shape[0] for r in caps_in]
        items = range(len(latents))
        both, rope, mask = _batch([torch.cat([x[b, :x_lens[b]], c[b, :c_lens[b]]]) for b in items],
                                  [torch.cat([x_rope[b, :x_lens[b]], c_rope[b, :c_lens[b]]]) for b in items])
        for block in self.layers:
            both = block(both, mask, rope, t_emb)
        out = self.all_final_layer[f"{PATCH}-1"](both, t_emb)
        results = []
        for b, latent in enumerate(latents):
            c_, h, w = latent.shape
            rows = out[b, :image_real[b]].view(1, h // PATCH, w // PATCH, 1, PATCH, PATCH, self.channels)
            results.append(rows.permute(6, 0, 3, 1, 4, 2, 5).reshape(self.channels, h, w))
        return results


def _batch(rows: list[torch.Tensor], ropes: list[torch.Tensor]
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Sequences of different lengths as one padded batch and its key mask (None when all are equal)."""
    lens = [r.shape[0] for r in rows]
    x = nn.utils.rnn.pad_sequence(rows, batch_first=True)
    rope = nn.utils.rnn.pad_sequence(ropes, batch_first=True)
    if len(set(lens)) == 1:
        return x, rope, None
    mask = torch.arange(x.shape[1], device=x.device)[None, :] < torch.tensor(lens, device=x.device)[:, None]
    return x, rope, mask
