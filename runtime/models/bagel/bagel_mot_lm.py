"""Component `bagel_mot_lm`: BAGEL's Qwen2.5 mixture-of-transformers LM.

One module serves every LM step of BAGEL: prompt prefill (text, ViT embeddings, VAE
latents), text decoding (logits of the next token) and flow-matching velocity
prediction for a noisy latent. A call runs a packed batch of `Segment`s, one per KV
sequence (see runtime/models/bagel/segments.py for the rows, attention and RoPE of each kind):

    model = component_class("bagel_mot_lm")(dims, args)
    cache = model.make_kv_cache(num_blocks, block_size)
    out = model(segments, cache)          # MoTOutput
    out.outputs[i]   # DECODE: (vocab,) fp32 logits; GEN: (C, h, w) velocity; else None
    out.states[i]    # (context_len, rope) of segment i's sequence after the call

Latent tokens: 2 x 2 patches of the (16, h, w) VAE latent -> vae2llm + timestep
embedding + latent position embedding; velocities: llm2vae of the generation expert's
final-normed rows, unpatchified back to (16, h, w). Weights load from BAGEL's checkpoint
names (`language_model.model.layers.N.self_attn.q_proj_moe_gen.weight`, `vae2llm.weight`,
`time_embedder.mlp.0.weight`, ...); other components' tensors in the same file are skipped.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from runtime.model_executor.attention import AttentionShape, select_backend
from runtime.models.bagel.embeddings import PositionEmbedding, TimestepEmbedder
from runtime.models.bagel.mot_layers import ExpertRows, MoTContext, MoTLayer
from runtime.models.bagel.patchify import grid_position_ids, patchify, unpatchify
from runtime.models.bagel.segments import Segment, SegmentKind, SegmentLayout, layout_segments
from runtime.model_executor.kv import PagedKVCache
from runtime.model_executor.layers.config import DecoderConfig, DecoderFamily
from runtime.model_executor.layers.norm import RMSNorm
from runtime.model_executor.layers.rotary import RotaryEmbedding
from runtime.model_executor.parallel import SINGLE, ParallelLMHead, VocabParallelEmbedding
from runtime.model_executor.weights import Slot, iter_safetensors, load_into, random_tensors
from runtime.model_executor.parallel.cpu_linear import device_of

log = logging.getLogger(__name__)

# a fixed sin-cos table: recomputed at build time, so the checkpoint's copy is not needed
FIXED_TENSORS = ("latent_pos_embed.pos_embed",)


@dataclass
class RowPlan:
    """Where each kind of input row of a packed call comes from."""

    token_rows: list[int] = field(default_factory=list)       # rows embedded from token ids
    token_ids: list[int] = field(default_factory=list)
    vit_rows: list[int] = field(default_factory=list)         # rows taken from ViT embeddings
    vit_segments: list[Segment] = field(default_factory=list)
    latent_rows: list[int] = field(default_factory=list)      # latent token rows (generation expert)
    latent_segments: list[Segment] = field(default_factory=list)
    positions: list[torch.Tensor] = field(default_factory=list)  # RoPE positions per segment

    @classmethod
    def of(cls, segments: Sequence[Segment], layout: SegmentLayout, token_ids) -> RowPlan:
        plan = cls()
        for seg, start, n in zip(segments, layout.starts, layout.lengths):
            causal = seg.is_causal
            plan.positions.append(torch.arange(seg.rope, seg.rope + n) if causal else torch.full((n,), seg.rope))
            plan.token_ids += token_ids(seg)
            plan.token_rows += range(start, start + n) if causal else [start, start + n - 1]  # image markers
            if seg.kind is SegmentKind.VIT:
                plan.vit_rows += range(start + 1, start + n - 1)
                plan.vit_segments.append(seg)
            elif not causal:
                plan.latent_rows += range(start + 1, start + n - 1)
                plan.latent_segments.append(seg)
        return plan


@dataclass(frozen=True)
class MoTOutput:
    outputs: list[torch.Tensor | None]   # per segment: DECODE logits (vocab,) fp32, GEN velocity (C, h, w)
    states: list[tuple[int, int]]        # per segment: (context_len, rope) after the call


def _index(device: torch.device, rows: Sequence[int]) -> torch.Tensor:
    return torch.tensor(list(rows), dtype=torch.long, device=device)


def _copy_into(param: torch.Tensor):
    return lambda t: param.data.copy_(t)


class BagelMoTLM(nn.Module):
    kind = "bagel_mot_lm"

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        args = dict(args or {})
        family = DecoderFamily(qkv_bias=True, qk_norm=bool(dims.get("qk_norm", True)))
        self.config = config = DecoderConfig.from_dims(dims, family)
        self.dims = dict(dims)
        self.patch = dims["latent_patch_size"]
        h, patch_dim = config.hidden_size, self.patch ** 2 * dims["latent_channels"]
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
        lm = self.language_model = nn.Module()
        lm.model = nn.Module()
        lm.model.embed_tokens = VocabParallelEmbedding(config.vocab_size, h, SINGLE)
        lm.model.layers = nn.ModuleList(MoTLayer(config, i, self.rotary_emb) for i in range(config.num_layers))
        lm.model.norm = RMSNorm(h, config.rms_norm_eps)
        lm.model.norm_moe_gen = RMSNorm(h, config.rms_norm_eps)
        lm.lm_head = ParallelLMHead(lm.model.embed_tokens, tied=False)
        self.time_embedder = TimestepEmbedder(h, dims["timestep_embedding_dim"])
        self.vae2llm = nn.Linear(patch_dim, h)
        self.llm2vae = nn.Linear(h, patch_dim)
        self.latent_pos_embed = PositionEmbedding(dims["max_latent_size"], h)
        self.backend_name: str = args.get("attention_backend", "auto")
        self._backend = None
        if args.get("weights"):
            self.load_weights(args["weights"])
        else:
            self.load_hf_state_dict(random_tensors(self.hf_slots(), int(args.get("seed", 0))))

    # ---- weights -------------------------------------------------------------------

    def hf_slots(self) -> dict[str, Slot]:
        """BAGEL checkpoint name -> (shape, loader) for every tensor this module reads."""
        c, lm = self.config, self.language_model
        slots = {"language_model.model.embed_tokens.weight": Slot(
                     (c.vocab_size, c.hidden_size), lambda t: lm.model.embed_tokens.load_weight(0, t)),
                 "language_model.lm_head.weight": Slot(
                     (c.vocab_size, c.hidden_size), lambda t: lm.lm_head.load_weight(0, t))}
        for norm in ("norm", "norm_moe_gen"):
            module = getattr(lm.model, norm)
            slots[f"language_model.model.{norm}.weight"] = Slot(
                (c.hidden_size,), lambda t, m=module: m.load_weight(0, t), True)
        for i, layer in enumerate(lm.model.layers):
            slots.update(layer.slots(f"language_model.model.layers.{i}.", c))
        for prefix in ("time_embedder", "vae2llm", "llm2vae"):
            for name, param in getattr(self, prefix).named_parameters():
                slots[f"{prefix}.{name}"] = Slot(tuple(param.shape), _copy_into(param))
        return slots

    def load_hf_state_dict(self, tensors) -> None:
        """Load BAGEL-named tensors; raises WeightLoadError listing missing/mis-shaped keys."""
        load_into(self.hf_slots(), tensors, optional=FIXED_TENSORS)

    def load_weights(self, path: str) -> None:
        """Load this component's tensors (BAGEL names) from safetensors holding exactly them (file or
        directory); which of BAGEL's combined `ema.safetensors` are this node's is the graph's mapping."""
        log.info("loading bagel_mot_lm weights from %s", path)
        self.load_hf_state_dict(iter_safetensors(path))

    def make_kv_cache(self, num_blocks: int, block_size: int, dtype: torch.dtype | None = None,
                      device: torch.device | str | None = None) -> PagedKVCache:
        """An empty paged cache (one per KV node; CFG branches may share one through block tables)."""
        weight = self.vae2llm.weight
        return PagedKVCache(self.config.num_layers, num_blocks, block_size, self.config.num_kv_heads,
                            self.config.head_dim, dtype=dtype or weight.dtype, device=device or device_of(self))

    # ---- inputs --------------------------------------------------------------------

    def _token_ids(self, seg: Segment) -> list[int]:
        d = self.dims
        if seg.kind is SegmentKind.TEXT:
            return [d["bos_token_id"], *seg.tokens.tolist(), d["eos_token_id"]]
        if seg.kind is SegmentKind.DECODE:
            return seg.tokens.tolist()
        return [d["start_of_image_id"], d["end_of_image_id"]]

    def _latent_tokens(self, latents: Sequence[torch.Tensor], times: Sequence[float]) -> torch.Tensor:
        """(sum T, hidden) embeddings of latent tokens: vae2llm + timestep + position."""
        dtype, p = self.vae2llm.weight.dtype, self.patch
        patches = torch.cat([patchify(lat.to(dtype), p) for lat in latents])
        counts = [(lat.shape[1] // p) * (lat.shape[2] // p) for lat in latents]
        pos = torch.cat([grid_position_ids(lat.shape[1] // p, lat.shape[2] // p, self.dims["max_latent_size"])
                         for lat in latents]).to(patches.device)
        t = torch.tensor(list(times), dtype=torch.float32, device=patches.device)
        t_emb = self.time_embedder(t).repeat_interleave(torch.tensor(counts, device=patches.device), dim=0)
        return self.vae2llm(patches) + t_emb + self.latent_pos_embed(pos).to(dtype)

    def _embed(self, segments: Sequence[Segment], layout: SegmentLayout, device: torch.device):
        """(N, hidden) input rows, (N,) positions, and the rows of each expert."""
        plan = RowPlan.of(segments, layout, self._token_ids)
        hidden = torch.zeros(layout.num_rows, self.config.hidden_size, dtype=self.vae2llm.weight.dtype, device=device)
        tokens = self.language_model.model.embed_tokens(_index(device, plan.token_ids))
        hidden[_index(device, plan.token_rows)] = tokens.to(hidden.dtype)
        if plan.vit_segments:
            hidden[_index(device, plan.vit_rows)] = torch.cat([s.embeds for s in plan.vit_segments]).to(hidden)
        latent_rows = _index(device, plan.latent_rows)
        if plan.latent_segments:
            hidden[latent_rows] = self._latent_tokens([s.latent for s in plan.latent_segments],
                                                      [s.timestep for s in plan.latent_segments])
        is_und = torch.ones(layout.num_rows, dtype=torch.bool, device=device)
        is_und[latent_rows] = False
        experts = ExpertRows(is_und.nonzero()[:, 0], latent_rows, layout.num_rows)
        return hidden, torch.cat(plan.positions).to(device), experts

    # ---- forward -------------------------------------------------------------------

    def attention_backend(self, device: torch.device):
        if self._backend is None:
            self._backend = select_backend(device, self.backend_name)
        return self._backend

    @torch.inference_mode()
    def forward(self, segments: Sequence[Segment], kv_cache: PagedKVCache) -> MoTOutput:
        """Run one packed call (see the module docstring and runtime/models/bagel/segments.py)."""
        device = device_of(self)
        layout = layout_segments(segments, self.patch, kv_cache.block_size, device)
        hidden, positions, experts = self._embed(segments, layout, device)
        backend = self.attention_backend(device)
        if layout.causal_metadata is not None:
            c = self.config
            shape = AttentionShape(c.num_q_heads, c.num_kv_heads, c.head_dim, kv_cache.dtype)
            backend.plan(layout.causal_metadata, shape)
        ctx = MoTContext(positions, experts, layout, kv_cache, backend)
        for layer in self.language_model.model.layers:
            hidden = layer(hidden, ctx)
        model = self.language_model.model
        hidden = experts.apply(model.norm, model.norm_moe_gen, hidden)
        outputs = [self._output(seg, hidden[start:start + n]) for seg, start, n in
                   zip(segments, layout.starts, layout.lengths)]
        return MoTOutput(outputs, [seg.advanced(self.patch) for seg in segments])

    def _output(self, seg: Segment, rows: torch.Tensor) -> torch.Tensor | None:
        if seg.kind is SegmentKind.DECODE:
            return self.language_model.lm_head(rows[-1:]).float()[0]
        if seg.kind is SegmentKind.GEN:
            _, h, w = seg.latent.shape
            return unpatchify(self.llm2vae(rows[1:-1]), h, w, self.patch)  # (C, h, w)
        return None
