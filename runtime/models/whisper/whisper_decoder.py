"""whisper_decoder: Whisper's text decoder over a paged KV cache holding its cross-attention memory too.

A request's table holds, in order, its memory rows (one per encoder output row, written once by
the Run that brings the encoder's output as `embeds`) and its token rows. At layer l a memory row's
slot holds `encoder_attn.k_proj / v_proj` of the encoder row, a token row's slot its self-attention
key and value: a token row attends causally to the token rows before it and, read-only, to every
memory row (mstar_compiler/catalogue/whisper.py says why this is the whole mechanism). The memory
rows run no layer of their own.

`positions` (from the executor) are -1 at memory rows and each token's place among the request's
tokens at the others (the learned position table's index). Parameter names follow transformers'
`WhisperDecoder` (`embed_tokens`, `embed_positions`, `layers.N.encoder_attn.q_proj`, `layer_norm`);
the logits are the final rows times the token embedding (Whisper ties its output projection).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import nn
from torch.nn import functional as F

from mstar_compiler.catalogue.whisper import vocab_size
from runtime.model_executor.attention import AttentionMetadata
from runtime.model_executor.kv import PagedKVCache
from runtime.model_executor.parallel.cpu_linear import device_of
from runtime.models.whisper.layers import Attention


@dataclass(frozen=True)
class _Layout:
    """Where one forward's token rows read from, shared by every layer (padded per request)."""

    memory_rows: torch.Tensor       # (m,) packed rows that bring memory
    token_rows: torch.Tensor        # (n,) packed rows of tokens
    queries: torch.Tensor           # (B, q) index into the token rows (padding: 0)
    query_valid: torch.Tensor       # (B, q) bool
    self_slots: torch.Tensor        # (B, k) flat cache slots of each request's token rows (padding: padding slot)
    self_mask: torch.Tensor         # (B, 1, q, k) bool: causal over its own token rows
    cross_slots: torch.Tensor       # (B, M) flat cache slots of each request's memory rows
    cross_mask: torch.Tensor        # (B, 1, 1, M) bool


def _layout(positions: list[int], batch: AttentionMetadata, padding_slot: int, device: torch.device) -> _Layout:
    bs, starts = batch.block_size, [0]
    for q in batch.query_lens_cpu:
        starts.append(starts[-1] + q)
    memory_rows = [r for r, p in enumerate(positions) if p < 0]
    token_rows = [r for r, p in enumerate(positions) if p >= 0]
    at_token = {r: i for i, r in enumerate(token_rows)}
    queries, selves, crosses, first = [], [], [], []      # per request with tokens in this Run
    for b, (q_len, seq, table) in enumerate(zip(batch.query_lens_cpu, batch.seq_lens_cpu, batch.block_tables_cpu)):
        rows = [r for r in range(starts[b], starts[b + 1]) if positions[r] >= 0]
        if not rows:
            continue
        pos0 = seq - q_len + rows[0] - starts[b]         # cache position of its first token row here
        memory = pos0 - positions[rows[0]]
        if memory <= 0:
            raise ValueError("whisper_decoder: a request's tokens came before any cross-attention memory "
                             "(its prompt needs the encoder's rows first)")
        places = torch.arange(seq)
        slots = (torch.tensor(table, dtype=torch.long)[places // bs] * bs + places % bs).tolist()
        queries.append([at_token[r] for r in rows])
        selves.append(slots[memory:])
        crosses.append(slots[:memory])
        first.append(positions[rows[0]])
    q_max = max((len(q) for q in queries), default=1)
    k_max = max((len(s) for s in selves), default=1)
    m_max = max((len(c) for c in crosses), default=1)
    n = len(queries)
    query_valid = torch.zeros(n, q_max, dtype=torch.bool)
    self_mask = torch.zeros(n, 1, q_max, k_max, dtype=torch.bool)
    cross_mask = torch.zeros(n, 1, 1, m_max, dtype=torch.bool)
    for b, (qs, ss, cs, p0) in enumerate(zip(queries, selves, crosses, first)):
        query_valid[b, :len(qs)] = True
        for i in range(q_max):      # query i sits at token position p0 + i; padding queries see key 0
            self_mask[b, 0, i, :(p0 + i + 1 if i < len(qs) else 1)] = True
        cross_mask[b, 0, 0, :len(cs)] = True

    def padded(lists: list[list[int]], width: int, fill: int) -> torch.Tensor:
        return torch.tensor([x + [fill] * (width - len(x)) for x in lists] or [[fill] * width], dtype=torch.long)
    return _Layout(*(t.to(device) for t in (
        torch.tensor(memory_rows, dtype=torch.long), torch.tensor(token_rows, dtype=torch.long),
        padded(queries, q_max, 0), query_valid, padded(selves, k_max, padding_slot), self_mask,
        padded(crosses, m_max, padding_slot), cross_mask)))


class _Layer(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        h, eps, heads = d["d_model"], d["layer_norm_eps"], d["decoder_attention_heads"]
        self.self_attn_layer_norm = nn.LayerNorm(h, eps=eps)
        self.self_attn = Attention(h, heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(h, eps=eps)
        self.encoder_attn = Attention(h, heads)
        self.final_layer_norm = nn.LayerNorm(h, eps=eps)
        self.fc1 = nn.Linear(h, d["decoder_ffn_dim"])
        self.fc2 = nn.Linear(d["decoder_ffn_dim"], h)

    def write_memory(self, layer: int, memory: torch.Tensor, slots: torch.Tensor, cache: PagedKVCache) -> None:
        attn = self.encoder_attn
        cache.write(layer, attn.heads(attn.k_proj(memory)), attn.heads(attn.v_proj(memory)), slots)

    def forward(self, x: torch.Tensor, layer: int, slots: torch.Tensor, at: _Layout, cache: PagedKVCache
                ) -> torch.Tensor:
        """x (n, d_model) token rows; `slots` (n,) where their keys and values go."""
        attn = self.self_attn
        a = self.self_attn_layer_norm(x)
        cache.write(layer, attn.heads(attn.k_proj(a)), attn.heads(attn.v_proj(a)), slots)
        x = x + attn.out_proj(_attend(attn, attn.q_proj(a), at.self_slots, at.self_mask, layer, cache, at))
        attn = self.encoder_attn
        a = self.encoder_attn_layer_norm(x)
        x = x + attn.out_proj(_attend(attn, attn.q_proj(a), at.cross_slots, at.cross_mask, layer, cache, at))
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


def _attend(attn: Attention, q: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor, layer: int,
            cache: PagedKVCache, at: _Layout) -> torch.Tensor:
    """(n, d_model) attention of the token rows' queries over the cache rows `slots` (per request, padded)."""
    queries = attn.heads(q)[at.queries].transpose(1, 2)                       # (B, heads, q, hd)
    keys = cache.k[layer].flatten(0, 1)[slots].transpose(1, 2).to(q.dtype)   # (B, heads, k, hd)
    values = cache.v[layer].flatten(0, 1)[slots].transpose(1, 2).to(q.dtype)
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask)
    return out.transpose(1, 2).flatten(2)[at.query_valid]                    # (n, d_model), in row order


class WhisperDecoder(nn.Module):
    """The Whisper decoder node (module docstring); the executor is runtime/models/whisper/executors.py's."""
    kind = "whisper_decoder"

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.d_model, self.num_heads = dims["d_model"], dims["decoder_attention_heads"]
        self.max_target_positions = dims["max_target_positions"]
        self.embed_tokens = nn.Embedding(vocab_size(dims), self.d_model)
        self.embed_positions = nn.Embedding(dims["max_target_positions"], self.d_model)
        self.layers = nn.ModuleList(_Layer(dims) for _ in range(dims["decoder_layers"]))
        self.layer_norm = nn.LayerNorm(self.d_model, eps=dims["layer_norm_eps"])

    def make_kv_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        weight = self.embed_tokens.weight
        return PagedKVCache(len(self.layers), num_blocks, block_size, self.num_heads,
                            self.d_model // self.num_heads, dtype=weight.dtype, device=device_of(self))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionMetadata,
                kv_cache: PagedKVCache, embeds: torch.Tensor | None = None,
                embeds_rows: torch.Tensor | None = None) -> torch.Tensor:
        """(N, d_model) final-normed rows of a packed batch (memory rows come back as they went in)."""
        at = _layout(positions.tolist(), batch, kv_cache.padding_slot, input_ids.device)
        if at.memory_rows.numel() and (embeds is None or embeds.shape[0] != at.memory_rows.numel()):
            raise ValueError(f"whisper_decoder: {at.memory_rows.numel()} memory rows but "
                             f"{0 if embeds is None else embeds.shape[0]} encoder rows to fill them")
        weight = self.embed_tokens.weight
        out = torch.zeros(input_ids.shape[0], self.d_model, dtype=weight.dtype, device=weight.device)
        memory = embeds.to(weight.dtype) if at.memory_rows.numel() else None
        token_pos = positions[at.token_rows]
        x = self.embed_tokens(input_ids[at.token_rows]) + self.embed_positions(token_pos)
        memory_slots, token_slots = batch.slot_mapping[at.memory_rows], batch.slot_mapping[at.token_rows]
        for i, layer in enumerate(self.layers):
            if memory is not None:
                layer.write_memory(i, memory, memory_slots, kv_cache)
            if at.token_rows.numel():
                x = layer(x, i, token_slots, at, kv_cache)
        out[at.token_rows] = self.layer_norm(x)
        if memory is not None:
            out[at.memory_rows] = memory
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(M, vocab) fp32 logits: rows times the token embedding (the tied output projection)."""
        return F.linear(hidden, self.embed_tokens.weight).float()
