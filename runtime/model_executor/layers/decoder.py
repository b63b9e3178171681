"""`DecoderLM`: the Llama / Qwen2 / Qwen3 / Qwen3-MoE decoder over a paged KV cache.

Interface (called by the worker's model runner, the sampling code and multimodal nodes):

    model = component_class("llama_lm")(dims, args)          # or DecoderLM subclass(dims, args, tp=group)
    cache = model.make_kv_cache(num_blocks, block_size)      # PagedKVCache, this rank's kv heads
    batch = manager.metadata([(req, n_new), ...])            # KVBlockManager -> AttentionMetadata
    hidden = model(input_ids, positions, batch, cache,       # (N, hidden_size), final-normed
                   embeds=None, embeds_rows=None)
    logits = model.compute_logits(hidden[batch.last_token_rows()])   # (B, vocab_size) fp32

* One call runs a *packed mixed batch*: prefill chunks and decode tokens of many
  requests of different lengths, N token rows in total, no padding. `input_ids` (N,)
  int64 and `positions` (N,) int64 — or (3, N) temporal/height/width positions for a
  preset with an `mrope_section` (Qwen3-Omni) — are the rows in request order; `batch` says which
  rows belong to which request and where their keys/values go (see
  runtime/model_executor/attention/metadata.py). The cache must already hold each request's context;
  this call writes the new rows' keys/values at `batch.slot_mapping`.
* Multimodal prompts: `embeds` (M, hidden_size) replace the token embeddings of rows
  `embeds_rows` (M,) int64 (their `input_ids` are ignored, e.g. a placeholder id).
* `hidden` is the last layer's output after the final RMSNorm — what `compute_logits`
  reads and what a downstream node (e.g. a talker) consumes from the `hidden` port.
* Weights: `args["weights"]` (safetensors file or dir, HF names) or seeded random
  weights (`args["seed"]`); `load_hf_state_dict(tensors)` loads HF-named tensors
  (q_proj/k_proj/v_proj and gate_proj/up_proj are fused on load) after a key-by-key check.
* Tensor parallelism: pass `tp=TensorParallelGroup(...)`; every rank loads the same full
  tensors and keeps its shard; logits come back whole on every rank.
"""
from __future__ import annotations

import logging
from typing import Any, ClassVar, Iterable, Mapping

import torch
from torch import nn

from runtime.model_executor.attention import AttentionBackend, AttentionMetadata, AttentionShape, select_backend
from runtime.model_executor.kv import PagedKVCache
from runtime.model_executor.kernels import cpu as cpu_kernels
from runtime.model_executor.layers.attention import BatchContext, DecoderAttention
from runtime.model_executor.layers.config import DecoderConfig, DecoderFamily
from runtime.model_executor.layers.cpu_stack import LayerStack
from runtime.model_executor.layers.mlp import GatedMLP
from runtime.model_executor.layers.moe import SparseMoE
from runtime.model_executor.layers.norm import RMSNorm
from runtime.model_executor.layers.rotary import RotaryEmbedding
from runtime.model_executor.parallel import SINGLE, ParallelLMHead, TensorParallelGroup, VocabParallelEmbedding
from runtime.model_executor.parallel.cpu_linear import device_of
from runtime.model_executor.weights import Slot, iter_safetensors, load_into, random_tensors

log = logging.getLogger(__name__)


class DecoderLayer(nn.Module):
    """Pre-norm block: h += attn(norm(h)); h += mlp(norm(h))."""

    def __init__(self, config: DecoderConfig, layer: int, rotary: RotaryEmbedding, tp: TensorParallelGroup,
                 mlp: nn.Module | None = None) -> None:
        """`mlp` replaces the family's MLP (e.g. the Qwen3-Omni talker's shared-expert MoE)."""
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DecoderAttention(config, layer, rotary, tp)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp: nn.Module = mlp if mlp is not None else (
            SparseMoE(config, tp) if config.sparse_layers[layer]
            else GatedMLP(config.hidden_size, config.intermediate_size, config.mlp_bias, tp))

    def forward(self, hidden: torch.Tensor, ctx: BatchContext) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), ctx)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))

    def slots(self, prefix: str, config: DecoderConfig) -> dict[str, Slot]:
        slots = self.self_attn.slots(f"{prefix}self_attn.", config)
        slots.update(self.mlp.slots(f"{prefix}mlp."))
        for norm in ("input_layernorm", "post_attention_layernorm"):
            module = getattr(self, norm)
            slots[f"{prefix}{norm}.weight"] = Slot((config.hidden_size,), lambda t, m=module: m.load_weight(0, t),
                                                   is_norm=True)
        return slots


class DecoderLM(nn.Module):
    """Decoder-only LM; subclasses (the kinds' classes) fix `family`."""

    family: ClassVar[DecoderFamily] = DecoderFamily()

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any] | None = None, *,
                 tp: TensorParallelGroup = SINGLE) -> None:
        super().__init__()
        args = dict(args or {})
        self.config = config = DecoderConfig.from_dims(dims, self.family)
        self.tp = tp
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
        self.model = nn.Module()
        self.model.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp)
        self.model.layers = nn.ModuleList(
            DecoderLayer(config, i, self.rotary_emb, tp) for i in range(config.num_layers))
        self.model.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = ParallelLMHead(self.model.embed_tokens, tied=config.tie_word_embeddings)
        self.backend_name: str = args.get("attention_backend", "auto")
        self._backend: AttentionBackend | None = None
        # the layers in one C++ call on CPU (runtime/model_executor/layers/cpu_stack.py): None until the first fused forward
        # decides, False where it cannot (or is switched off)
        self.cpu_stack: LayerStack | bool | None = None
        if args.get("weights"):
            self.load_weights(args["weights"])
        else:
            self.load_hf_state_dict(random_tensors(self.hf_slots(), int(args.get("seed", 0))))

    # ---- weights -------------------------------------------------------------------

    def hf_slots(self) -> dict[str, Slot]:
        """HF checkpoint name -> (full shape, loader) for every tensor this model reads."""
        table = (self.config.vocab_size, self.config.hidden_size)
        slots = {"model.embed_tokens.weight": Slot(table, lambda t: self.model.embed_tokens.load_weight(0, t)),
                 "model.norm.weight": Slot(table[1:], lambda t: self.model.norm.load_weight(0, t), is_norm=True)}
        if not self.config.tie_word_embeddings:
            slots["lm_head.weight"] = Slot(table, lambda t: self.lm_head.load_weight(0, t))
        for i, layer in enumerate(self.model.layers):
            slots.update(layer.slots(f"model.layers.{i}.", self.config))
        return slots

    def load_hf_state_dict(self, tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load HF-named tensors; raises WeightLoadError listing missing/unexpected/mis-shaped keys."""
        optional = ("lm_head.weight",) if self.config.tie_word_embeddings else ()
        load_into(self.hf_slots(), tensors, optional=optional)

    def load_weights(self, path: str) -> None:
        """Load a safetensors checkpoint (file or directory) in HF layout, or a GGUF file (read as it is, its
        Q4 blocks kept for linears quantized int4_g32: runtime.model_executor.parallel.quant)."""
        log.info("loading %s weights from %s", type(self).__name__, path)
        from runtime.model_executor.weights.gguf_loader import is_gguf_ref, open_gguf
        if is_gguf_ref(path):
            self.load_hf_state_dict(open_gguf(path).iter_state_dict(int4_blocks=True))
        else:
            self.load_hf_state_dict(iter_safetensors(path))

    # ---- cache and attention -------------------------------------------------------

    def make_kv_cache(self, num_blocks: int, block_size: int, dtype: torch.dtype | None = None,
                      device: torch.device | str | None = None) -> PagedKVCache:
        """An empty paged cache for this model's layers and this rank's kv heads."""
        weight = self.model.embed_tokens.weight
        return PagedKVCache(self.config.num_layers, num_blocks, block_size,
                            self.config.num_kv_heads // self.tp.size, self.config.head_dim,
                            dtype=dtype or weight.dtype, device=device or device_of(self))

    def attention_backend(self, device: torch.device) -> AttentionBackend:
        if self._backend is None:
            self._backend = select_backend(device, self.backend_name)
        return self._backend

    def attention_shape(self, dtype: torch.dtype) -> AttentionShape:
        return AttentionShape(self.config.num_q_heads // self.tp.size, self.config.num_kv_heads // self.tp.size,
                              self.config.head_dim, dtype)

    # ---- forward -------------------------------------------------------------------

    def embed(self, input_ids: torch.Tensor, embeds: torch.Tensor | None = None,
              embeds_rows: torch.Tensor | None = None) -> torch.Tensor:
        """(N, hidden) token embeddings, with rows `embeds_rows` replaced by `embeds`."""
        hidden = self.model.embed_tokens(input_ids)
        if embeds is not None:
            hidden = hidden.index_copy(0, embeds_rows, embeds.to(hidden.dtype))
        return hidden

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionMetadata,
                kv_cache: PagedKVCache, embeds: torch.Tensor | None = None,
                embeds_rows: torch.Tensor | None = None) -> torch.Tensor:
        """(N, hidden_size) final-normed hidden states of a packed mixed batch (see module doc)."""
        backend = self.attention_backend(input_ids.device)
        backend.plan(batch, self.attention_shape(kv_cache.dtype))
        return self.forward_planned(input_ids, positions, batch, kv_cache, backend, embeds, embeds_rows)

    def forward_planned(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionMetadata,
                        kv_cache: PagedKVCache, backend: AttentionBackend, embeds: torch.Tensor | None = None,
                        embeds_rows: torch.Tensor | None = None) -> torch.Tensor:
        """`forward` after `backend.plan(batch, ...)`: device work only, no host reads, so a
        CUDA graph can capture it (runtime/model_executor/compiled). RoPE cos/sin are computed once here
        and shared by every layer."""
        hidden = self.embed(input_ids, embeds, embeds_rows)
        fused = cpu_kernels.usable(hidden)
        ctx = BatchContext(positions, batch, kv_cache, backend, self.rotary_emb.cos_sin(positions, hidden.dtype), fused)
        if fused:
            return self._forward_fused(hidden, ctx)
        for layer in self.model.layers:
            hidden = layer(hidden, ctx)
        return self.model.norm(hidden)

    def _forward_fused(self, residual: torch.Tensor, ctx: BatchContext) -> torch.Tensor:
        """The layers on CPU with each residual add fused into the norm after it (runtime/model_executor/kernels/cpu.py):
        the same sums and norms as DecoderLayer.forward, `residual` updated in place."""
        if self.cpu_stack is None:
            self.cpu_stack = LayerStack.for_model(self) or False
        if self.cpu_stack:      # the same kernel calls in one C++ call, when this batch can (cpu_stack.py)
            out = self.cpu_stack.run(residual, ctx)
            if out is not None:
                return out
        layers = self.model.layers
        first = layers[0].input_layernorm
        x = cpu_kernels.rms_norm(residual, first.weight, first.eps)
        for i, layer in enumerate(layers):
            norm = layer.post_attention_layernorm
            x = cpu_kernels.add_rms_norm(residual, layer.self_attn(x, ctx), norm.weight, norm.eps)
            norm = layers[i + 1].input_layernorm if i + 1 < len(layers) else self.model.norm
            x = cpu_kernels.add_rms_norm(residual, layer.mlp(x), norm.weight, norm.eps)
        return x

    @property
    def is_graph_capturable(self) -> bool:
        """Whether `forward_planned` can be CUDA-graph captured: sparse-MoE layers read their
        expert counts back to the host, and tensor-parallel collectives stay eager."""
        return self.tp.size == 1 and not any(self.config.sparse_layers)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(M, vocab_size) fp32 logits of final-normed hidden rows (M, hidden_size)."""
        return self.lm_head(hidden).float()
