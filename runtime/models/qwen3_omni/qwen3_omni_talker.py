"""qwen3_omni_talker: Qwen3-Omni's talker, a Qwen3-MoE decoder that speaks what the thinker writes.

It reads thinker-width states through two projections — `text_projection` for token
embeddings, `hidden_projection` for the thinker's layer-`accept_hidden_layer` states of
audio/image/video positions — and emits codebook 0 of one 12.5 Hz codec frame per step
through `codec_head`. Its next input is the sum of the codec embeddings of the frame it
just spoke (codebook 0 from `model.codec_embedding`, the others from the code
predictor) plus the projected embedding of the next thinker token (see
`runtime/models/qwen3_omni/__init__.py` for the whole loop and `talker_prompt.py` for the prompt).

Interface (weights: the checkpoint's `talker.*` tensors except `talker.code_predictor.*`):

    talker = component_class("qwen3_omni_talker")(dims, args)
    cache = talker.make_kv_cache(num_blocks, block_size)
    hidden = talker(inputs_embeds, positions, batch, cache)   # (N, hidden_size), final-normed
    logits = talker.compute_logits(hidden[batch.last_token_rows()])   # (B, vocab) fp32

`inputs_embeds` (N, hidden_size) are packed rows of a mixed prefill/decode batch exactly
as for `DecoderLM` (runtime/model_executor/layers/decoder.py); `positions` are (N,) or (3, N) M-RoPE
positions (temporal, height, width — equal for text).
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from runtime.model_executor.attention import AttentionBackend, AttentionMetadata, AttentionShape, select_backend
from runtime.model_executor.kv import PagedKVCache
from runtime.model_executor.layers.attention import BatchContext
from runtime.model_executor.layers.config import DecoderConfig, DecoderFamily
from runtime.model_executor.layers.decoder import DecoderLayer
from runtime.model_executor.layers.norm import RMSNorm
from runtime.model_executor.parallel import SINGLE, TensorParallelGroup
from runtime.models.qwen3_omni.talker_layers import MRotaryEmbedding, ResizeMLP, SharedExpertMoE
from runtime.models.qwen3_omni.weights import CheckpointWeights, decoder_slots, initialise
from runtime.model_executor.weights import Slot
from runtime.model_executor.parallel.cpu_linear import device_of


class Qwen3OmniTalker(CheckpointWeights, nn.Module):
    """Talker LM over inputs_embeds; `compute_logits` gives codebook-0 logits."""
    kind = "qwen3_omni_talker"

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any] | None = None, *,
                 tp: TensorParallelGroup = SINGLE) -> None:
        super().__init__()
        args = dict(args or {})
        self.dims = dict(dims)
        self.config = config = DecoderConfig.from_dims(dims, DecoderFamily(qk_norm=True))
        self.tp = tp
        h, shared = config.hidden_size, dims["shared_expert_intermediate_size"]
        self.rotary_emb = MRotaryEmbedding(config.head_dim, config.rope_theta, dims["mrope_section"])
        self.model = nn.Module()
        self.model.codec_embedding = nn.Embedding(config.vocab_size, h)
        self.model.layers = nn.ModuleList(
            DecoderLayer(config, i, self.rotary_emb, tp, mlp=SharedExpertMoE(config, shared, tp))
            for i in range(config.num_layers))
        self.model.norm = RMSNorm(h, config.rms_norm_eps)
        self.text_projection = ResizeMLP(dims["thinker_hidden_size"], dims["intermediate_size"], h)
        self.hidden_projection = ResizeMLP(dims["thinker_hidden_size"], dims["intermediate_size"], h)
        self.codec_head = nn.Linear(h, config.vocab_size, bias=False)
        self.backend_name: str = args.get("attention_backend", "auto")
        self._backend: AttentionBackend | None = None
        initialise(self.hf_slots(), args)

    def hf_slots(self) -> dict[str, Slot]:
        plain = {"model.codec_embedding": self.model.codec_embedding, "model.norm": self.model.norm,
                 "text_projection": self.text_projection, "hidden_projection": self.hidden_projection,
                 "codec_head": self.codec_head}
        return decoder_slots(self.model.layers, self.config, plain)

    # ---- cache and attention (as DecoderLM) -----------------------------------------

    def make_kv_cache(self, num_blocks: int, block_size: int, dtype: torch.dtype | None = None,
                      device: torch.device | str | None = None) -> PagedKVCache:
        weight = self.codec_head.weight
        return PagedKVCache(self.config.num_layers, num_blocks, block_size, self.config.num_kv_heads // self.tp.size,
                            self.config.head_dim, dtype=dtype or weight.dtype, device=device or device_of(self))

    def _attention(self, device: torch.device, dtype: torch.dtype) -> tuple[AttentionBackend, AttentionShape]:
        if self._backend is None:
            self._backend = select_backend(device, self.backend_name)
        shape = AttentionShape(self.config.num_q_heads // self.tp.size, self.config.num_kv_heads // self.tp.size,
                               self.config.head_dim, dtype)
        return self._backend, shape

    # ---- inputs ---------------------------------------------------------------------

    def project_text(self, thinker_embeds: torch.Tensor) -> torch.Tensor:
        """(N, thinker_hidden_size) thinker token embeddings -> (N, hidden_size) talker rows."""
        return self.text_projection(thinker_embeds)

    def project_hidden(self, thinker_hidden: torch.Tensor) -> torch.Tensor:
        """(N, thinker_hidden_size) thinker layer states of multimodal positions -> (N, hidden_size)."""
        return self.hidden_projection(thinker_hidden)

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """(...,) codec ids (codebook 0 or special codec tokens) -> (..., hidden_size)."""
        return self.model.codec_embedding(codes)

    # ---- forward --------------------------------------------------------------------

    def forward(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, batch: AttentionMetadata,
                kv_cache: PagedKVCache) -> torch.Tensor:
        """(N, hidden_size) final-normed hidden states of a packed mixed batch."""
        backend, shape = self._attention(inputs_embeds.device, kv_cache.dtype)
        backend.plan(batch, shape)
        ctx = BatchContext(positions, batch, kv_cache, backend)
        hidden = inputs_embeds
        for layer in self.model.layers:
            hidden = layer(hidden, ctx)
        return self.model.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(M, vocab_size) fp32 codebook-0 logits of final-normed hidden rows (M, hidden_size)."""
        return self.codec_head(hidden).float()

    def speakable(self) -> torch.Tensor:
        """(vocab_size,) bool: the ids a talker step may emit — codebook entries and codec EOS.
        The other special codec ids only ever appear in the prompt (Qwen3-Omni's generate
        suppresses them the same way)."""
        allowed = torch.arange(self.config.vocab_size) < self.dims["codebook_size"]
        allowed[self.dims["codec_eos_token_id"]] = True
        return allowed.to(device_of(self))
