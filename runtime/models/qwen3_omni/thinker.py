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

Prefix caching: this executor decides reuse itself, as BAGEL's does. Its rows are named by content
(row_keys.py: token ids, and at audio / image / video placeholders a digest of the row's embedding with
its DeepStack columns plus its M-RoPE position), so a chat's pictures and the text after them are
found again: the next turn of a conversation about a picture reuses the picture and the turns before.
Each Run looks up the longest cached chain of its rows after the request's rows so far (a piece that
ended mid-block continues in the cached block holding its rows) and sets `WorkItem.cached` to what
it reuses; at least its last row is computed (its logits). A Run that feeds a talker (`stream_out`)
reads layer `accept_hidden_layer`'s states at the placeholders (`hidden:mm`), which a reused row computes
none of: the states computed at media rows are kept (`TappedRows`, by the row's key chained over every
row before it: equal keys, equal states), and such a Run reuses rows up to the first placeholder whose
state is not kept, taking the kept ones; so a spoken conversation's next turn reuses its earlier audio.
The conductor cannot compute a digest, so it counts this node's pool from the worker's reports
(`kv_reported`; runtime/conductor/kv_ledger.py): the blocks the cache holds after each batch and close,
plus ceil(tokens / block) for every Run not yet answered, so a request whose picture or conversation is
cached costs only what it took once its first Run is answered, and what the conductor admits always fits;
the counters reach /metrics through `prefix_stats`. Blocks are keyed after the forward that wrote them; a failed Run keys none of its rows.
"""
from __future__ import annotations

from itertools import accumulate
from typing import Any, Mapping

import torch
from torch import nn

from mstar_compiler.plan import Node, Plan
from runtime.worker.executors import ExecResult
from runtime.model_executor.kv import KVBlockManager, PrefixCachingAllocator, PrefixStats
from runtime.model_executor.kv.prefix_cache import Row
from runtime.model_executor.layers.attention import BatchContext
from runtime.models.decoder_lm.executors import DecoderLMExecutor
from runtime.models.qwen3_omni.mrope import MropePositions
from runtime.models.qwen3_omni.row_keys import ROOT, TappedRows, chain_keys, thinker_rows
from runtime.transport.messages import KVState, WorkItem
from runtime.transport.request_params import RequestParams


MAX_TAPPED_ROWS = 8192     # media rows whose talker-read states are kept (~12 min of audio at 12.5 rows a second)


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

    Prefix caching (module docstring): rows keyed by content, reuse decided here. The `hidden`
    stream is the fed tokens' input embeddings, so cached rows need no forward for it."""

    states_need_forward = False

    def __init__(self, node: Node, model: nn.Module, rank: int, tts_ids: tuple[int, int, int],
                 placeholder_ids: tuple[int, ...] = (), plan: Plan | None = None,
                 vision: Mapping[str, Any] | None = None, picture_pads: tuple[int, int] = (-1, -1),
                 tap_layer: int = 0) -> None:
        self.placeholder_ids = frozenset(placeholder_ids)   # first: with them declared, the base class caches
        super().__init__(node, model, rank, plan, prefix_cache=True)
        # reuse is decided here (module docstring): the conductor counts what this reports, no placeholder stops;
        # a tensor-parallel group's ranks would each have to decide alike, so it caches nothing
        self.kv_prefix_key, self.kv_prefix_stop_ids = "", frozenset()
        self.kv_reported = node.name     # the conductor counts this pool from the worker's reports
        root = self.prefix_root if node.placement.tp_size == 1 else None
        self.blocks = KVBlockManager(self.kv_blocks, self.kv_block_size, root)   # its own tables: it decides reuse
        self._rows: dict[int, list[Row] | None] = {}       # request -> this Run's rows as the cache keys them
        self._positions: dict[int, torch.Tensor] = {}       # request -> this Run's positions, every row
        self._chains: dict[int, bytes | None] = {}          # request -> chain_keys after its rows so far
        self._keys: dict[int, list[bytes] | None] = {}      # request -> this Run's rows' chain keys
        self._taps = TappedRows(MAX_TAPPED_ROWS)
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
        self._chains.pop(request_id, None)       # a recompute after preemption starts the chain again

    def drop_prefix_cache(self) -> None:
        """Cache no prefixes (`mstar-run --no-prefix-cache`); called before any request opens."""
        self.blocks = KVBlockManager(self.kv_blocks, self.kv_block_size)

    def prefix_stats(self) -> PrefixStats | None:
        allocator = self.blocks.allocator
        return allocator.stats if isinstance(allocator, PrefixCachingAllocator) else None

    def kv_used_blocks(self) -> int:
        return self.kv_blocks - self.blocks.allocator.num_free

    def import_kv(self, msg: KVState, tensors: dict[str, torch.Tensor]) -> None:
        """A moved cache, in blocks this executor's own tables take for it."""
        if msg.request_id in self.blocks:
            self.blocks.free(msg.request_id)
        self.blocks.allocate(msg.request_id, msg.num_tokens)
        self._write_kv(msg, tensors)

    def _reserve(self, items: list[WorkItem]) -> list[int]:
        """Room for every item's rows in this executor's own tables, reusing the `item.cached` rows
        `_look_up` found; the cache position of each item's first computed row."""
        starts = []
        for item in items:
            rid, rows = item.request_id, self._rows[item.request_id]
            if rid not in self.blocks:
                self.blocks.allocate(rid, len(item.tokens), rows, reuse=item.cached)
                starts.append(item.cached)
            else:     # a later piece of the prompt may continue in cached blocks too
                starts.append(self.blocks.num_tokens(rid) + item.cached)
                # copied at once: an OutOfBlocks for a later item must not leave a table without its copy
                self.cache.copy_blocks(self.blocks.append(rid, len(item.tokens), rows, reuse=item.cached))
        return starts

    def positions(self, item: WorkItem, start: int) -> torch.Tensor:
        return self._positions[item.request_id][..., item.cached:]

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]:
        starts = [self.blocks.num_tokens(i.request_id) if i.request_id in self.blocks else 0 for i in items]
        inputs = [self._with_deepstack(ins) for ins in inputs]
        for item, start, ins in zip(items, starts, inputs):
            self._look_up(item, start, ins)
        early = [i.request_id for i in items if self._is_early_piece(i)]
        try:
            results = super().run(items, inputs)
            for item in items:    # written: later requests may share the full blocks
                self.blocks.commit(item.request_id)
                keys = self._keys.get(item.request_id)
                self._chains[item.request_id] = keys[-1] if keys else None
        except BaseException:    # what the failed forward was to write is never keyed
            for item in items:
                if item.request_id in self.blocks:
                    self.blocks.uncache(item.request_id)
                self._chains[item.request_id] = None
            self._keys.clear()
            raise
        finally:
            self._rows.clear()
            self._positions.clear()
        for rid in early:          # its token is dropped by the conductor: the request's state forgets it too
            self._states[rid].undo_last()
        ends = list(accumulate(len(item.tokens) - item.cached for item in items))
        for item, start, end, result in zip(items, starts, ends, results):
            self._stream_rows(item, start, result, self.model.tapped, end)
        self._keys.clear()
        return results

    def _is_early_piece(self, item: WorkItem) -> bool:
        """A prompt piece (text, audio, image item) that more pieces follow: its sample is not the answer's."""
        rid = item.request_id
        return not item.partial and rid not in self._streamed \
            and len(self._pending.get(rid, [])) + 1 < self._num_prompt_items.get(rid, 1)

    def _look_up(self, item: WorkItem, start: int, ins: dict[str, torch.Tensor]) -> None:
        """The Run's positions and rows (module docstring), and `item.cached`: its leading rows in the cache."""
        rid = item.request_id
        n = len(item.tokens)
        if self.mrope is not None:
            positions = self.mrope.positions(rid, item.tokens, start).to(self.device)          # (3, n)
        else:
            positions = torch.arange(start, start + n, dtype=torch.long, device=self.device)  # (n,)
        self._positions[rid] = positions
        rows, media = self._key_rows(item, start, ins, positions.expand(3, -1))
        self._rows[rid] = rows
        chain = self._chains.get(rid) if start else ROOT
        keys = self._keys[rid] = chain_keys(chain, rows) if rows is not None and chain is not None else None
        # a talker reads the states at media rows: reuse stops at the first whose state is not kept
        limit = next((m for m in media if keys is None or keys[m] not in self._taps), None) \
            if item.stream_out else None
        item.cached = self.blocks.prefix_hit(rows, rid if rid in self.blocks else None, limit) if rows else 0

    def _key_rows(self, item: WorkItem, start: int, ins: dict[str, torch.Tensor],
                  positions: torch.Tensor) -> tuple[list[Row] | None, list[int]]:
        """(the Run's rows as the cache keys them, None when their content is not known here; the
        indices of its media rows). Embeds fill the placeholders of the Run that brings them; a Run
        at position 0 of a request given embeds before is a recompute of its history: not keyed."""
        at = [i for i, t in enumerate(item.tokens) if t in self.placeholder_ids]
        recompute = start == 0 and bool(self._embeds.get(item.request_id))
        if "embeds" not in ins:
            return (None if recompute and at else list(item.tokens)), []
        if recompute or not at or ins["embeds"].shape[0] != len(at):
            return None, at      # a mismatch fails the forward, with its message
        return thinker_rows(item.tokens, at, ins["embeds"], positions), at

    def _stream_rows(self, item: WorkItem, start: int, result: ExecResult, tapped: torch.Tensor | None,
                     end: int) -> None:
        """Put the embeddings of the tokens this Run fed on the `hidden` stream (module docstring): a
        prompt read in pieces (text, audio, image items, one Run each) goes as one item once its last
        piece has run (param `num_prompt_items`), as the talker's first Run takes the whole prompt."""
        rid = item.request_id
        done = self._num_fed.get(rid, 0)
        ids = torch.tensor(item.tokens[max(0, done - start):], dtype=torch.long,
                           device=self.device)                           # a recompute re-feeds history
        self._num_fed[rid] = done + len(ids)
        pending = self._pending.setdefault(rid, [])
        pending.append((ids, None if rid in self._streamed else self._mm_rows(item, len(item.tokens) - len(ids),
                                                                              tapped, end)))
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

    def _mm_rows(self, item: WorkItem, skip: int, tapped: torch.Tensor | None, end: int) -> torch.Tensor:
        """(n, hidden) tapped states at the multimodal placeholders among the item's tokens from `skip`
        on (its computed rows end at batch row `end`), zeros elsewhere and at reused rows (reused only
        in Runs that stream nothing to a talker, module docstring)."""
        tokens = torch.tensor(item.tokens, dtype=torch.long, device=self.device)
        rows = torch.zeros(len(tokens), self.node.dims["hidden_size"], device=self.device)
        is_mm = torch.isin(tokens, torch.tensor(sorted(self.placeholder_ids), device=self.device))
        keys = self._keys.get(item.request_id)
        for i in is_mm[:item.cached].nonzero().flatten().tolist() if keys is not None else []:
            kept = self._taps.get(keys[i])           # kept for every reused one where a talker reads them
            if kept is not None:
                rows[i] = kept
        is_mm[:item.cached] = False
        if tapped is not None and is_mm.any():
            computed = is_mm[item.cached:]
            rows[is_mm] = tapped[end - len(computed):end][computed].to(rows.dtype)
            for i in is_mm.nonzero().flatten().tolist() if keys is not None else []:
                self._taps.put(keys[i], rows[i].clone())
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
