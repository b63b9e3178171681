"""Reference attention backend in plain torch (any device; the CPU path).

Decode rows (query length 1) of all requests are attended in one batched call: their
pages are gathered into a padded (B, L, kv_heads, D) tensor and masked beyond each
request's length. Prefill chunks are attended one request at a time with a causal mask
offset by the request's context, which keeps large prompts free of padding.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.attention.backend import AttentionBackend, AttentionShape
from runtime.attention.metadata import AttentionMetadata


class TorchAttention(AttentionBackend):
    name = "torch"

    def plan(self, batch: AttentionMetadata, shape: AttentionShape) -> None:
        device = batch.seq_lens.device
        decode = [b for b, q in enumerate(batch.query_lens_cpu) if q == 1]
        self._decode_reqs = torch.tensor(decode, dtype=torch.long, device=device)
        self._decode_rows = batch.query_start_loc[:-1].long()[self._decode_reqs]
        width = max((len(batch.block_tables_cpu[b]) for b in decode), default=0)
        self._decode_tables = batch.block_tables[self._decode_reqs, :width].long()
        keys = torch.arange(width * batch.block_size, device=device)
        valid = keys[None, :] < batch.seq_lens[self._decode_reqs, None]                  # (Bd, L)
        # an additive mask built once per forward, not once per layer
        bias = torch.zeros(valid.shape, dtype=shape.dtype, device=device)
        self._decode_bias = bias.masked_fill(~valid, float("-inf"))
        self._prefill = [b for b, q in enumerate(batch.query_lens_cpu) if q > 1]

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               batch: AttentionMetadata, scale: float) -> torch.Tensor:
        if not self._prefill:
            return self._attend_decode(q, k_cache, v_cache, scale)
        out = torch.empty_like(q)
        if len(self._decode_reqs):
            out[self._decode_rows] = self._attend_decode(q[self._decode_rows], k_cache, v_cache, scale)
        row = 0
        for b, q_len in enumerate(batch.query_lens_cpu):
            if q_len > 1:
                out[row:row + q_len] = self._attend_prefill(q[row:row + q_len], k_cache, v_cache, batch, b, scale)
            row += q_len
        return out

    def _attend_decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       scale: float) -> torch.Tensor:
        n, hq, d = q.shape
        hkv = k_cache.shape[2]
        k = k_cache[self._decode_tables].flatten(1, 2).transpose(1, 2)  # (B, Hkv, L, D)
        v = v_cache[self._decode_tables].flatten(1, 2).transpose(1, 2)
        q = q.view(n, hkv, hq // hkv, d)                                # (B, Hkv, group, D)
        mask = self._decode_bias[:, None, None, :].to(q.dtype)           # (B, 1, 1, L)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return o.reshape(n, hq, d)

    def _attend_prefill(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        batch: AttentionMetadata, b: int, scale: float) -> torch.Tensor:
        q_len, s = q.shape[0], batch.seq_lens_cpu[b]
        blocks = torch.tensor(batch.block_tables_cpu[b], dtype=torch.long, device=q.device)
        k = k_cache[blocks].flatten(0, 1)[:s].transpose(0, 1)          # (Hkv, S, D)
        v = v_cache[blocks].flatten(0, 1)[:s].transpose(0, 1)
        rows = torch.arange(s - q_len, s, device=q.device)
        mask = torch.arange(s, device=q.device)[None, :] <= rows[:, None]  # (q_len, S)
        o = F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=mask, scale=scale,
                                           enable_gqa=True)          # (Hq, q_len, D)
        return o.transpose(0, 1)
