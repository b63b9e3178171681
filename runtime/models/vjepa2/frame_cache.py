"""Per-request, per-frame KV cache of the V-JEPA 2-AC predictor.

Why a cache is exact here: the predictor's attention mask is block-causal over frame
steps and positions are absolute frame indices, so the keys/values of frame step t (its
2 conditioning tokens and its patch tokens) depend only on steps <= t. Rollout step h
therefore computes only the new step's tokens and attends to the cached ones.

Layout: one contiguous buffer per request, sized for the request's whole rollout when
it is admitted (context + horizon frame steps), so appending never reallocates:
  k, v  (num_layers, num_heads, max_steps * tokens_per_step, head_dim)
Positions [0, num_steps * tokens_per_step) are filled, in frame-step order, each step
being [action, state, patch 0 .. patch P-1].
"""
from __future__ import annotations

import torch


class FrameKVCache:
    """Keys and values of every predictor layer for one request's frame steps so far."""

    def __init__(self, num_layers: int, num_heads: int, head_dim: int, tokens_per_step: int, max_steps: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        shape = (num_layers, num_heads, max_steps * tokens_per_step, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.tokens_per_step = tokens_per_step
        self.max_steps = max_steps
        self.num_steps = 0  # frame steps whose keys/values are stored (all layers)

    @property
    def num_tokens(self) -> int:
        return self.num_steps * self.tokens_per_step

    def can_append(self, num_steps: int) -> bool:
        return self.num_steps + num_steps <= self.max_steps

    def keys_values(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The filled part of one layer: (heads, num_tokens, head_dim) views, twice."""
        n = self.num_tokens
        return self.k[layer, :, :n], self.v[layer, :, :n]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store one layer's keys/values (heads, n * tokens_per_step, head_dim) after the filled part."""
        lo = self.num_tokens
        if lo + k.shape[1] > self.k.shape[2]:
            raise ValueError(f"frame KV cache full: {self.max_steps} frame steps reserved for this request")
        self.k[layer, :, lo:lo + k.shape[1]] = k
        self.v[layer, :, lo:lo + v.shape[1]] = v

    def commit(self, num_steps: int) -> None:
        """Every layer has written `num_steps` new frame steps: make them visible."""
        self.num_steps += num_steps

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2
