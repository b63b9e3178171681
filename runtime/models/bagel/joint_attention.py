"""Attention of a packed BAGEL call: each segment over its cached context plus its own rows.

The shared paged backends (`runtime.model_executor.attention`) implement causal attention over keys
already written to the cache. BAGEL also needs image blocks that attend bidirectionally
inside the block, and generation steps whose keys never enter the cache. This module
does both for any segment: the context's keys/values are gathered from the cache blocks, the
segment's own keys/values are appended as computed, and the mask is causal (offset by
the context) or absent. When every segment of a call is causal and writes its keys
(text prefill, decode), the model uses the paged backend instead (`SegmentLayout.causal_metadata`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.models.bagel.segments import SegmentLayout


def attend_segments(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, layout: SegmentLayout, scale: float) -> torch.Tensor:
    """q (N, Hq, D), k and v (N, Hkv, D) of the packed rows -> attention output (N, Hq, D).

    k_cache, v_cache: one layer's cache (num_blocks, block_size, Hkv, D).
    """
    out = torch.empty_like(q)
    k_slots = k_cache.view(-1, *k_cache.shape[2:])  # (num_blocks * block_size, Hkv, D)
    v_slots = v_cache.view(-1, *v_cache.shape[2:])
    for start, n, slots, mask in zip(layout.starts, layout.lengths, layout.context_slots, layout.masks):
        rows = slice(start, start + n)
        keys = torch.cat([k_slots[slots].to(k.dtype), k[rows]])      # (context + n, Hkv, D)
        values = torch.cat([v_slots[slots].to(v.dtype), v[rows]])
        # a batch of one, (1, H, rows, D): the CPU's fused (flash) SDPA kernel takes 4-D inputs only; a 3-D call
        # falls back to the math path, which materialises the scores (docs/benchmark-log.md: the cost)
        o = F.scaled_dot_product_attention(q[rows].transpose(0, 1)[None], keys.transpose(0, 1)[None],
                                           values.transpose(0, 1)[None], attn_mask=mask, scale=scale,
                                           enable_gqa=True)  # (1, Hq, n, D)
        out[rows] = o[0].transpose(0, 1)
    return out
