"""whisper_decoder: Whisper's text decoder over a paged KV cache holding its cross-attention memory too.

A request's table holds, in order, its memory rows (one per encoder output row, written once by
the Run that brings the encoder's output as `embeds`) and its token rows. At layer l a memory row's
slot holds `encoder_attn.k_proj / v_proj` of the encoder row, a token row's slot its self-attention
key and value: a token row attends causally to the token rows before it and, read-only, to every
memory row (mstar_compiler/catalogue/whisper.py says why this is the whole mechanism). The memory
rows run no layer of their own.

`positions` (from the executor) are (2, N): each row's place among its request's tokens (the learned
position table's index), -1 at memory rows and -2 at padding rows (the prompt may pad its memory to a
whole number of KV blocks: its tokens then start on a block, and on CPU every attention reads the
blocks where they lie through `runtime.model_executor.kernels.cpu.paged_decode`, one table and length
per token row; otherwise, or without the kernels, each request's rows are gathered and attended by
SDPA), and the request's memory rows. Parameter names follow transformers'
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
from runtime.model_executor.kernels import cpu as cpu_kernels
from runtime.model_executor.kv import PagedKVCache
from runtime.model_executor.parallel.cpu_linear import device_of
from runtime.models.whisper.layers import Attention


@dataclass(frozen=True)
class _Layout:
    """Where one forward's token rows read from, shared by every layer. On the paged path each token row
    has its own block table and length for each attention (runtime.model_executor.kernels.cpu.paged_decode
    reads the blocks where they lie); on the gather path each request's rows are copied out, padded."""

    memory_rows: torch.Tensor       # (m,) packed rows that bring memory
    token_rows: torch.Tensor        # (n,) packed rows of tokens
    paged: bool
    cross: tuple[torch.Tensor, ...]  # paged: (n, W) tables, (n,) lengths; gather: (B, M) slots, (B, 1, 1, M) mask
    selves: tuple[torch.Tensor, ...]  # paged: (n, W) tables, (n,) lengths; gather: (B, k) slots, (B, 1, q, k) mask
    queries: torch.Tensor | None = None       # gather: (B, q) index into the token rows (padding: 0)
    query_valid: torch.Tensor | None = None   # gather: (B, q) bool


@dataclass
class _Request:
    rows: list[int]         # its token rows in this forward (indices among the token rows)
    first: int              # the learned position of its first token row here
    memory: int             # its memory rows (cache positions 0 .. memory-1)
    region: int             # memory rows + padding rows: its tokens' cache positions start here
    table: tuple[int, ...]  # its blocks
    seq: int                # its cached rows after this forward


def _requests(learned: list[int], memory_of: list[int], batch: AttentionMetadata) -> list[_Request]:
    token_rows = [r for r, p in enumerate(learned) if p >= 0]
    at_token = {r: i for i, r in enumerate(token_rows)}
    found, start = [], 0
    for q_len, seq, table in zip(batch.query_lens_cpu, batch.seq_lens_cpu, batch.block_tables_cpu):
        rows = [r for r in range(start, start + q_len) if learned[r] >= 0]
        if rows:
            region = seq - q_len + rows[0] - start - learned[rows[0]]
            memory = memory_of[rows[0]]
            if not 0 < memory <= region:
                raise ValueError("whisper_decoder: a request's tokens came before its cross-attention memory "
                                 "(its prompt needs the encoder's rows first)")
            found.append(_Request([at_token[r] for r in rows], learned[rows[0]], memory, region, table, seq))
        start += q_len
    return found


def _paged(found: list[_Request], bs: int, device: torch.device) -> tuple[tuple[torch.Tensor, ...], ...]:
    cross_tables, cross_lens, self_tables, self_lens = [], [], [], []
    for req in found:
        for i in range(len(req.rows)):
            cross_tables.append(req.table[:-(-req.memory // bs)])
            cross_lens.append(req.memory)
            own = req.first + i + 1                     # the token rows it sees, itself included
            self_tables.append(req.table[req.region // bs:-(-(req.region + own) // bs)])
            self_lens.append(own)

    def table(rows: list[tuple[int, ...]]) -> torch.Tensor:
        width = max(len(r) for r in rows)
        return torch.tensor([r + (r[0],) * (width - len(r)) for r in rows], dtype=torch.long, device=device)
    lens = (torch.tensor(x, dtype=torch.long, device=device) for x in (cross_lens, self_lens))
    return (table(cross_tables), next(lens)), (table(self_tables), next(lens))


def _gathered(found: list[_Request], bs: int, padding_slot: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    queries, selves, crosses = [], [], []
    for req in found:
        places = torch.arange(req.seq)
        slots = (torch.tensor(req.table, dtype=torch.long)[places // bs] * bs + places % bs).tolist()
        queries.append(req.rows)
        selves.append(slots[req.region:])
        crosses.append(slots[:req.memory])
    q_max, k_max, m_max = (max(len(x) for x in lists) for lists in (queries, selves, crosses))
    n = len(found)
    query_valid = torch.zeros(n, q_max, dtype=torch.bool)
    self_mask = torch.zeros(n, 1, q_max, k_max, dtype=torch.bool)
    cross_mask = torch.zeros(n, 1, 1, m_max, dtype=torch.bool)
    for b, (req, cs) in enumerate(zip(found, crosses)):
        query_valid[b, :len(req.rows)] = True
        for i in range(q_max):      # query i sits at token position first + i; padding queries see key 0
            self_mask[b, 0, i, :(req.first + i + 1 if i < len(req.rows) else 1)] = True
        cross_mask[b, 0, 0, :len(cs)] = True

    def padded(lists: list[list[int]], width: int, fill: int) -> torch.Tensor:
        return torch.tensor([x + [fill] * (width - len(x)) for x in lists], dtype=torch.long)
    return tuple(t.to(device) for t in (padded(crosses, m_max, padding_slot), cross_mask,
                                        padded(selves, k_max, padding_slot), self_mask,
                                        padded(queries, q_max, 0), query_valid))


def _layout(positions: torch.Tensor, batch: AttentionMetadata, padding_slot: int, device: torch.device,
            kernels: bool) -> _Layout:
    """`positions` (2, N): each row's learned position (-1: a memory row, -2: a padding row after the memory)
    and its request's memory rows. The paged path needs each request's token rows to start on a block."""
    learned, memory_of = positions.tolist()
    memory_rows = torch.tensor([r for r, p in enumerate(learned) if p == -1], dtype=torch.long, device=device)
    token_rows = torch.tensor([r for r, p in enumerate(learned) if p >= 0], dtype=torch.long, device=device)
    found = _requests(learned, memory_of, batch)
    if not found:
        return _Layout(memory_rows, token_rows, False, (), ())
    if kernels and all(req.region % batch.block_size == 0 for req in found):
        cross, selves = _paged(found, batch.block_size, device)
        return _Layout(memory_rows, token_rows, True, cross, selves)
    cross_slots, cross_mask, self_slots, self_mask, queries, valid = _gathered(found, batch.block_size, padding_slot,
                                                                              device)
    return _Layout(memory_rows, token_rows, False, (cross_slots, cross_mask), (self_slots, self_mask), queries, valid)


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
        x = x + attn.out_proj(_attend(attn, attn.q_proj(a), at.selves, layer, cache, at))
        attn = self.encoder_attn
        a = self.encoder_attn_layer_norm(x)
        x = x + attn.out_proj(_attend(attn, attn.q_proj(a), at.cross, layer, cache, at))
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


def _attend(attn: Attention, q: torch.Tensor, reads: tuple[torch.Tensor, ...], layer: int,
            cache: PagedKVCache, at: _Layout) -> torch.Tensor:
    """(n, d_model) attention of the token rows' queries over the cache rows `reads` names (`_Layout`)."""
    if at.paged:
        tables, lengths = reads
        out = cpu_kernels.paged_decode(attn.heads(q), cache.k[layer], cache.v[layer], tables, lengths,
                                       attn.head_dim ** -0.5)
        return out.flatten(1)
    slots, mask = reads
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
        weight = self.embed_tokens.weight
        kernels = (cpu_kernels.usable(weight.detach()) and cpu_kernels.heads_fit(self.d_model // self.num_heads)
                   and kv_cache.dtype == weight.dtype)
        at = _layout(positions, batch, kv_cache.padding_slot, input_ids.device, kernels)
        if at.memory_rows.numel() and (embeds is None or embeds.shape[0] != at.memory_rows.numel()):
            raise ValueError(f"whisper_decoder: {at.memory_rows.numel()} memory rows but "
                             f"{0 if embeds is None else embeds.shape[0]} encoder rows to fill them")
        out = torch.zeros(input_ids.shape[0], self.d_model, dtype=weight.dtype, device=weight.device)
        memory = embeds.to(weight.dtype) if at.memory_rows.numel() else None
        token_pos = positions[0, at.token_rows]
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
