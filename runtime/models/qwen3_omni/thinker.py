"""The Qwen3-Omni thinker on the worker: a `qwen3_moe_lm` with the published model's multimodal prompt.

Beyond the decoder-LM executor (runtime/models/decoder_lm/executors.py) it
  * streams its fed tokens' input embeddings to the talker (`hidden`, see executors.py): the
    prompt as one item, however many items (text, audio, image) it is read in;
  * gives every row its 3-D M-RoPE position (runtime/models/qwen3_omni/mrope.py) when the
    plan has a vision encoder: image and video placeholders sit on (t, h, w) grids;
  * streams, with the prompt, the states of decoder layer `accept_hidden_layer` at its audio,
    image and video placeholders (`hidden:mm`): the talker's prompt reads those there;
  * adds DeepStack features: the vision encoder's `deepstack` (D, T, hidden) rows are
    added to the hidden states at the picture's placeholder rows after each of the first
    D decoder layers, as transformers' `Qwen3OmniMoeThinkerTextModel._deepstack_process`.
    The executor keeps them with the request's `embeds` as extra columns, (T, (1 + D)·hidden),
    zeros for audio rows (adding zero changes nothing), so a recompute after preemption
    finds them where it finds the embeds.

Prefix caching, as for every decoder LM: the conductor owns this node's block tables and decides reuse
(runtime/conductor/kv_ledger.py). It names a Run's rows before any worker runs: token ids, and at the audio,
image and video pads of a Run that reads a media item, that item's digest and the row's index
(runtime/conductor/media_keys.py, `kv_media_ids`); so the next turn of a conversation about a picture reuses
the picture and the turns before, admitted with only its new blocks charged. A recompute after preemption
keeps its ids, and its pads stop the keying (`kv_prefix_stop_ids`). A Run that feeds a talker reads layer
`accept_hidden_layer`'s states at the media rows (`hidden:mm`), which a reused row computes none of: each
media row's state is kept beside its KV, at the same cache slot (`_taps`, (blocks · block size, hidden),
allocated with the first picture or audio: hidden / (2 · layers · KV heads · head dim) of the KV pool's
memory, ~4% for the published thinker, outside the plan's KV pool), so whoever reuses the row's KV finds its
state with it, kept exactly as long as the block.
"""
from __future__ import annotations

from itertools import accumulate
from typing import Any, Mapping

import torch
from torch import nn

from mstar_compiler.plan import Node, Plan
from runtime.worker.executors import ExecResult
from runtime.model_executor.layers.attention import BatchContext
from runtime.models.decoder_lm.executors import DecoderLMExecutor
from runtime.models.qwen3_omni.mrope import MropePositions
from runtime.transport.messages import WorkItem
from runtime.transport.request_params import RequestParams


class DeepStackLM:
    """A decoder LM whose `embeds` carry DeepStack columns (module docstring); otherwise the LM itself.

    A forward with `embeds` keeps the output of decoder layer `tap_layer - 1` (before its DeepStack
    add; transformers' `hidden_states[tap_layer]`) as `tapped` (N, hidden): the talker reads it at
    the multimodal rows. Without embeds `tapped` is None."""

    def __init__(self, lm: nn.Module, num_layers: int, tap_layer: int) -> None:
        self.lm, self.num_layers, self.tap_layer = lm, num_layers, tap_layer
        self.embed, self.compute_logits = lm.embed, lm.compute_logits
        self.tapped: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: Any, cache: Any,
                 embeds: torch.Tensor | None = None, embeds_rows: torch.Tensor | None = None) -> torch.Tensor:
        lm = self.lm
        self.tapped = None
        if embeds is None:
            return lm(input_ids, positions, batch, cache)
        size = lm.config.hidden_size
        deep = embeds[:, size:].reshape(embeds.shape[0], self.num_layers, size)   # (M, D, hidden)
        backend = lm.attention_backend(input_ids.device)
        backend.plan(batch, lm.attention_shape(cache.dtype))
        hidden = lm.embed(input_ids, embeds[:, :size], embeds_rows)
        ctx = BatchContext(positions, batch, cache, backend, lm.rotary_emb.cos_sin(positions, hidden.dtype))
        for i, layer in enumerate(lm.model.layers):
            hidden = layer(hidden, ctx)
            if i == self.tap_layer - 1:
                self.tapped = hidden
            if i < self.num_layers:
                hidden = hidden.index_add(0, embeds_rows, deep[:, i].to(hidden.dtype))
        return lm.model.norm(hidden)


class ThinkerExecutor(DecoderLMExecutor):
    """A `qwen3_moe_lm` thinker whose `hidden` stream feeds a talker (module docstring).

    Prefix caching (module docstring): the conductor keys the rows and decides reuse; the `hidden`
    stream is the fed tokens' input embeddings, so cached rows need no forward for it."""

    states_need_forward = False

    def __init__(self, node: Node, model: nn.Module, rank: int, tts_ids: tuple[int, int, int],
                 placeholder_ids: tuple[int, ...] = (), plan: Plan | None = None,
                 vision: Mapping[str, Any] | None = None, picture_pads: tuple[int, int] = (-1, -1),
                 tap_layer: int = 0) -> None:
        self.placeholder_ids = frozenset(placeholder_ids)   # first: with them declared, the base class caches
        super().__init__(node, model, rank, plan, prefix_cache=True)
        self.kv_media_ids = self.kv_prefix_stop_ids         # named by their media item where the conductor knows it
        self._taps: torch.Tensor | None = None              # (blocks * block size, hidden): media rows' tapped states
        self.tts_ids = torch.tensor(tts_ids, dtype=torch.long, device=self.device)
        self._num_fed: dict[int, int] = {}              # request -> rows whose embeddings were taken
        self._num_prompt_items: dict[int, int] = {}     # request -> thinker Runs its prompt takes
        # request -> (ids, mm rows; None once the prompt went) of rows not streamed yet
        self._pending: dict[int, list[tuple[torch.Tensor, torch.Tensor | None]]] = {}
        self._streamed: set[int] = set()                # requests whose prompt item went
        self.num_deepstack = len(vision["deepstack_visual_indexes"]) if vision else 0
        self.mrope = None
        if vision is not None:
            if model.rotary_emb.mrope_section is None:
                raise ValueError(f"node '{node.name}' ({node.source}): the plan reads images, but the thinker preset "
                                 f"'{node.preset}' has no rope_scaling.mrope_section for their 3-D positions")
            self.mrope = MropePositions(picture_pads, int(vision["spatial_merge_size"]))
        self.model = DeepStackLM(model, self.num_deepstack, tap_layer)

    def open(self, request_id: int, params: RequestParams) -> None:
        super().open(request_id, params)
        # set by the family's chat-input reader (chat_inputs.request_params); a text prompt sets neither
        self._num_prompt_items[request_id] = int(params.family.get("num_prompt_items", 1))
        if self.mrope is not None:
            self.mrope.open(request_id, str(params.family.get("mrope_grids", "")))

    def close(self, request_id: int, kv_only: bool) -> None:
        super().close(request_id, kv_only)
        if not kv_only:
            for held in (self._num_fed, self._num_prompt_items, self._pending):
                held.pop(request_id, None)
            self._streamed.discard(request_id)
            if self.mrope is not None:
                self.mrope.close(request_id)

    def _reserve(self, items: list[WorkItem]) -> list[int]:
        """The base class's, the kept states copied with their blocks (a copy-on-write of a shared block)."""
        if self._taps is not None:
            taps = self._taps.view(self.kv_blocks, self.kv_block_size, -1)
            for item in items:
                for src, dst in item.kv_copies:
                    taps[dst] = taps[src]
        return super()._reserve(items)

    def positions(self, item: WorkItem, start: int) -> torch.Tensor:
        """(3, n) M-RoPE positions of the rows after the Run's cached ones, with a vision encoder; else (n,)."""
        if self.mrope is None:
            return super().positions(item, start)
        run_start = start - item.cached           # every row of the Run gets its position, in order
        return self.mrope.positions(item.request_id, item.tokens, run_start).to(self.device)[..., item.cached:]

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]:
        starts = [self.blocks.num_tokens(i.request_id) if i.request_id in self.blocks else 0 for i in items]
        inputs = [self._with_deepstack(ins) for ins in inputs]
        early = [i.request_id for i in items if self._is_early_piece(i)]
        results = super().run(items, inputs)
        for rid in early:          # its token is dropped by the conductor: the request's state forgets it too
            self._states[rid].undo_last()
        ends = list(accumulate(len(item.tokens) - item.cached for item in items))
        tapped = self.model.tapped
        for item, start, end, result in zip(items, starts, ends, results):
            is_mm = self._media_at(item)
            if tapped is not None:
                self._keep_taps(item, start, tapped, end, is_mm)
            self._stream_rows(item, start, result, tapped, end, is_mm)
        return results

    def _is_early_piece(self, item: WorkItem) -> bool:
        """A prompt piece (text, audio, image item) that more pieces follow: its sample is not the answer's."""
        rid = item.request_id
        return not item.partial and rid not in self._streamed \
            and len(self._pending.get(rid, [])) + 1 < self._num_prompt_items.get(rid, 1)

    def _media_at(self, item: WorkItem) -> torch.Tensor:
        """(n,) bool: which of the item's tokens are audio, image or video pads."""
        tokens = torch.tensor(item.tokens, dtype=torch.long, device=self.device)
        return torch.isin(tokens, torch.tensor(sorted(self.placeholder_ids), dtype=torch.long, device=self.device))

    def _slots(self, item: WorkItem, start: int, rows: torch.Tensor) -> torch.Tensor:
        """Cache slots of the item's rows at indices `rows` (the Run's first row at cache position `start`)."""
        table = torch.tensor(self.blocks.table(item.request_id).blocks, dtype=torch.long, device=self.device)
        at = rows + start
        return table[at // self.kv_block_size] * self.kv_block_size + at % self.kv_block_size

    def _keep_taps(self, item: WorkItem, start: int, tapped: torch.Tensor, end: int, is_mm: torch.Tensor) -> None:
        """Keep the tapped states this Run computed at its media rows, at their cache slots (module docstring)."""
        computed = is_mm[item.cached:]
        if not computed.any():
            return
        if self._taps is None:
            self._taps = tapped.new_zeros(self.kv_blocks * self.kv_block_size, tapped.shape[-1])
        rows = computed.nonzero().flatten()
        self._taps[self._slots(item, start, rows + item.cached)] = tapped[end - len(computed):end][computed]

    def _stream_rows(self, item: WorkItem, start: int, result: ExecResult, tapped: torch.Tensor | None,
                     end: int, is_mm: torch.Tensor) -> None:
        """Put the embeddings of the tokens this Run fed on the `hidden` stream (module docstring): a
        prompt read in pieces (text, audio, image items, one Run each) goes as one item once its last
        piece has run (param `num_prompt_items`), as the talker's first Run takes the whole prompt."""
        rid = item.request_id
        done = self._num_fed.get(rid, 0)
        ids = torch.tensor(item.tokens[max(0, done - start):], dtype=torch.long,
                           device=self.device)                           # a recompute re-feeds history
        self._num_fed[rid] = done + len(ids)
        pending = self._pending.setdefault(rid, [])
        skip = len(item.tokens) - len(ids)
        pending.append((ids, None if rid in self._streamed else self._mm_rows(item, start, skip, tapped, end, is_mm)))
        if rid not in self._streamed and len(pending) < self._num_prompt_items.get(rid, 1):
            result.outputs.pop("hidden", None)          # more prompt pieces follow: no stream item yet
            return
        pieces = self._pending.pop(rid)
        ids = torch.cat([i for i, _ in pieces])
        result.outputs["hidden"] = self.model.embed(ids)                       # (n, hidden)
        result.outputs["hidden:ids"] = ids
        if rid not in self._streamed:
            result.outputs["hidden:tts"] = self.model.embed(self.tts_ids)      # (3, hidden)
            result.outputs["hidden:mm"] = torch.cat([m for _, m in pieces])    # (n, hidden)
            self._streamed.add(rid)

    def _mm_rows(self, item: WorkItem, start: int, skip: int, tapped: torch.Tensor | None, end: int,
                 is_mm: torch.Tensor) -> torch.Tensor:
        """(n, hidden) tapped states at the multimodal placeholders (`is_mm`) among the item's tokens from `skip`
        on (its computed rows end at batch row `end`; reused ones come from their slots), zeros elsewhere."""
        rows = torch.zeros(len(item.tokens), self.node.dims["hidden_size"], device=self.device)
        is_mm = is_mm.clone()
        reused = is_mm[:item.cached].nonzero().flatten()
        if len(reused) and self._taps is not None:   # kept at their slots by the Run that computed them
            rows[reused] = self._taps[self._slots(item, start, reused)].to(rows.dtype)
        is_mm[:item.cached] = False
        if tapped is not None and is_mm.any():
            computed = is_mm[item.cached:]
            rows[is_mm] = tapped[end - len(computed):end][computed].to(rows.dtype)
        return rows[skip:]

    def _with_deepstack(self, ins: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`embeds` (T, hidden) widened to (T, (1 + D)·hidden) by the Run's DeepStack rows (zeros for audio)."""
        if not self.num_deepstack or "embeds" not in ins:
            return ins
        embeds = ins["embeds"].to(self.device)
        deep = ins.get("deepstack")
        if deep is None:
            deep = embeds.new_zeros(self.num_deepstack, *embeds.shape)
        deep = deep.to(self.device, embeds.dtype).transpose(0, 1).reshape(embeds.shape[0], -1)     # (T, D·hidden)
        return {**ins, "embeds": torch.cat((embeds, deep), dim=1)}
