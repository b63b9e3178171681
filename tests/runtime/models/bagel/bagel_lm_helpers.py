"""Factories for the BAGEL LM tests: seeded tiny models, a runner that keeps KV sequences
the way the worker does (KVBlockManager + PagedKVCache), and the same sequence run by the
dense reference."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable

import torch

from mstar_compiler.catalogue import load_catalogue
from runtime.models.bagel.segments import Segment, SegmentKind
from runtime.model_executor.components import component_class
from runtime.model_executor.kv import KVBlockManager

from bench.bagel_upstream_lm import DenseBagel

SPEC = load_catalogue()["bagel_mot_lm"]
DIMS = dict(SPEC.presets["tiny"])


def bagel_weights(dims: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random BAGEL-named tensors for every slot of a `bagel_mot_lm` (norms noisy too)."""
    model = component_class("bagel_mot_lm")(dims, {"seed": seed})
    g = torch.Generator().manual_seed(seed + 1)
    return {name: (1 + 0.1 * torch.randn(slot.shape, generator=g)) if slot.is_norm
            else 0.05 * torch.randn(slot.shape, generator=g)
            for name, slot in model.hf_slots().items()}


def build_lm(weights: dict[str, torch.Tensor], dims: dict | None = None):
    model = component_class("bagel_mot_lm")(dims or DIMS, {"seed": 0}).eval()
    model.load_hf_state_dict(weights)
    return model


class Runner:
    """KV sequences over one paged cache, as the worker keeps them."""

    def __init__(self, model, num_blocks: int = 64, block_size: int = 4) -> None:
        self.model = model
        self.cache = model.make_kv_cache(num_blocks, block_size)
        self.blocks = KVBlockManager(num_blocks, block_size)
        self.rope: dict[Hashable, int] = {}

    def segment(self, seq: Hashable, kind: SegmentKind, **inputs) -> Segment:
        """The segment of `seq`'s next call; reserves cache room for the rows it writes."""
        if seq not in self.blocks:
            self.blocks.allocate(seq, 0)
            self.rope[seq] = 0
        context = self.blocks.num_tokens(seq)
        probe = Segment(kind, context, self.rope[seq], **inputs)
        if probe.writes_kv:
            self.cache.copy_blocks(self.blocks.append(seq, probe.num_rows(self.model.patch)))
        return Segment(kind, context, self.rope[seq], tuple(self.blocks.table(seq).blocks), **inputs)

    def run(self, calls: list[tuple[Hashable, Segment]]) -> list:
        out = self.model([seg for _, seg in calls], self.cache)
        for (seq, _), (_, rope) in zip(calls, out.states):
            self.rope[seq] = rope
        return out.outputs

    def one(self, seq: Hashable, kind: SegmentKind, **inputs):
        return self.run([(seq, self.segment(seq, kind, **inputs))])[0]


@dataclass
class RefSequence:
    """One KV sequence run by the dense reference."""

    ref: DenseBagel
    context: list | None = None
    rope: int = 0
    ids: dict = field(default_factory=dict)

    def _run(self, rows, pos, gen_rows, causal, keep):
        out, context = self.ref.forward(rows, pos, gen_rows, self.context, causal)
        if keep:
            self.context = context
        return out

    def text(self, ids):
        d = self.ref.d
        rows = self.ref.embed([d["bos_token_id"], *ids, d["eos_token_id"]])
        self._run(rows, torch.arange(self.rope, self.rope + len(rows)), torch.tensor([], dtype=torch.long), True, True)
        self.rope += len(rows)

    def decode(self, token):
        out = self._run(self.ref.embed([token]), torch.tensor([self.rope]), torch.tensor([], dtype=torch.long),
                        True, True)
        self.rope += 1
        return out[0] @ self.ref.W["language_model.lm_head.weight"].T

    def _block(self, middle, gen):
        d = self.ref.d
        rows = torch.cat([self.ref.embed([d["start_of_image_id"]]), middle, self.ref.embed([d["end_of_image_id"]])])
        gen_rows = torch.arange(1, len(rows) - 1) if gen else torch.tensor([], dtype=torch.long)
        return rows, torch.full((len(rows),), self.rope), gen_rows

    def vit(self, embeds):
        self._run(*self._block(embeds, False), False, True)
        self.rope += 1

    def vae(self, latent):
        self._run(*self._block(self.ref.latent_rows(latent, 0.0), True), False, True)
        self.rope += 1

    def gen(self, latent, t):
        out = self._run(*self._block(self.ref.latent_rows(latent, t), True), False, False)
        return self.ref.unpack_velocity(out[1:-1], latent.shape[1], latent.shape[2])
