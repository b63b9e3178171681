"""qwen3_omni_code_predictor: Qwen3-Omni's multi-token predictor, codebooks 1..G-1 of a frame.

A small dense Qwen3 decoder (the shared `runtime.model_executor.layers.DecoderLayer`) with one codec
embedding and one head per residual codebook. For each frame it reads a two-row prefix —
the talker's final hidden state at the step that emitted codebook 0, and the talker's
embedding of that code — then predicts codebook g with `lm_head[g-1]` and feeds it back
through `codec_embedding[g-1]`, G-1 steps in all. Each frame is a fresh sequence of at
most G rows; its keys/values live in a paged cache, one block per request, so every step
runs only the new row.

Interface (weights: the checkpoint's `talker.code_predictor.*`):

    predictor = component_class("qwen3_omni_code_predictor")(dims, args)
    codes, frame_embed = predictor.predict_frames(prefix, code0, sample=None, kv_cache=None)
        prefix       (B, 2, hidden_size)   talker hidden and talker embedding of code0, per request
        code0        (B,) int64            codebook 0 of each request's frame
        sample       logits (B, vocab) -> (B,) codes; greedy argmax when None
        codes        (B, num_code_groups)  the frames, codebook 0 first
        frame_embed  (B, hidden_size)      prefix[:, 1] + sum of the residual codes' embeddings:
                                           the talker's next input before the text row is added
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import torch
from torch import nn

from runtime.model_executor.attention import AttentionBackend, AttentionMetadata, AttentionShape, select_backend
from runtime.model_executor.kv import PagedKVCache
from runtime.model_executor.layers import DecoderConfig, DecoderFamily, DecoderLayer
from runtime.model_executor.layers.attention import BatchContext
from runtime.model_executor.layers.norm import RMSNorm
from runtime.model_executor.layers.rotary import RotaryEmbedding
from runtime.model_executor.parallel import SINGLE, TensorParallelGroup
from runtime.models.qwen3_omni.weights import CheckpointWeights, decoder_slots, initialise
from runtime.model_executor.weights import Slot
from runtime.model_executor.parallel.cpu_linear import device_of

Sample = Callable[[torch.Tensor], torch.Tensor]     # logits (B, vocab) -> (B,) ids


def greedy(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1)


class Qwen3OmniCodePredictor(CheckpointWeights, nn.Module):
    kind = "qwen3_omni_code_predictor"

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any] | None = None, *,
                 tp: TensorParallelGroup = SINGLE) -> None:
        super().__init__()
        args = dict(args or {})
        self.config = config = DecoderConfig.from_dims(dims, DecoderFamily(qk_norm=True))
        self.tp, self.num_code_groups = tp, int(dims["num_code_groups"])
        h, v, residual = config.hidden_size, config.vocab_size, self.num_code_groups - 1
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta)
        self.model = nn.Module()
        self.model.layers = nn.ModuleList(DecoderLayer(config, i, self.rotary_emb, tp) for i in range(config.num_layers))
        self.model.norm = RMSNorm(h, config.rms_norm_eps)
        self.model.codec_embedding = nn.ModuleList(nn.Embedding(v, h) for _ in range(residual))
        self.lm_head = nn.ModuleList(nn.Linear(h, v, bias=False) for _ in range(residual))
        self.backend_name: str = args.get("attention_backend", "auto")
        self._backend: AttentionBackend | None = None
        initialise(self.hf_slots(), args)

    def hf_slots(self) -> dict[str, Slot]:
        plain = {"model.norm": self.model.norm, "model.codec_embedding": self.model.codec_embedding,
                 "lm_head": self.lm_head}
        return decoder_slots(self.model.layers, self.config, plain)

    def make_kv_cache(self, num_blocks: int, block_size: int | None = None, dtype: torch.dtype | None = None,
                      device: torch.device | str | None = None) -> PagedKVCache:
        """A cache for `num_blocks` concurrent frames (a frame needs one block of num_code_groups rows)."""
        weight = self.lm_head[0].weight
        return PagedKVCache(self.config.num_layers, num_blocks, block_size or self.num_code_groups,
                            self.config.num_kv_heads // self.tp.size, self.config.head_dim,
                            dtype=dtype or weight.dtype, device=device or device_of(self))

    def forward(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, batch: AttentionMetadata,
                kv_cache: PagedKVCache) -> torch.Tensor:
        """(N, hidden_size) final-normed hidden states of packed rows (see DecoderLM.forward)."""
        if self._backend is None:
            self._backend = select_backend(inputs_embeds.device, self.backend_name)
        shape = AttentionShape(self.config.num_q_heads // self.tp.size, self.config.num_kv_heads // self.tp.size,
                               self.config.head_dim, kv_cache.dtype)
        self._backend.plan(batch, shape)
        ctx = BatchContext(positions, batch, kv_cache, self._backend)
        hidden = inputs_embeds
        for layer in self.model.layers:
            hidden = layer(hidden, ctx)
        return self.model.norm(hidden)

    @torch.no_grad()
    def predict_frames(self, prefix: torch.Tensor, code0: torch.Tensor, sample: Sample | None = None,
                       kv_cache: PagedKVCache | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Codebooks 1..G-1 for a batch of frames (see the module docstring)."""
        b, device = prefix.shape[0], prefix.device
        sample = sample or greedy
        kv_cache = kv_cache or self.make_kv_cache(b, device=device)
        if kv_cache.num_blocks < b or kv_cache.block_size < self.num_code_groups:
            raise ValueError(f"the code predictor needs {b} cache blocks of >= {self.num_code_groups} rows, "
                             f"got {kv_cache.num_blocks} of {kv_cache.block_size}")
        tables = [[i] for i in range(b)]  # request i owns block i for this frame
        codes, frame_embed = [code0], prefix[:, 1].clone()
        rows = prefix.reshape(2 * b, -1)  # (2B, H): request i's prefix is rows 2i, 2i+1
        for step in range(self.num_code_groups - 1):
            length = step + 2
            width = 2 if step == 0 else 1
            batch = AttentionMetadata.build([width] * b, [length] * b, tables, kv_cache.block_size, device)
            positions = torch.arange(length - width, length, device=device).repeat(b)
            hidden = self(rows, positions, batch, kv_cache)[batch.last_token_rows()]  # (B, H)
            code = sample(self.lm_head[step](hidden).float())
            rows = self.model.codec_embedding[step](code)  # (B, H): next step's input
            frame_embed += rows
            codes.append(code)
        return torch.stack(codes, dim=1), frame_embed
