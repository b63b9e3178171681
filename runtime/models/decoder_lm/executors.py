"""Runs a decoder LM node (`runtime.model_executor.layers.DecoderLM` kinds) over a batch: mixed prefill/decode.

One call packs every request's new tokens (a whole prompt, a recomputed context after
preemption, or one decode token) into one forward over the paged KV cache, then samples
one token per request with that request's own `SamplingState` (seeded per request, so the
batch around a request never changes its tokens). A prompt chunk with more to follow
(`WorkItem.partial`, chunked prefill) only fills the cache: no logits, no token. The
conductor owns the block tables and tells each Run what changed in its request's
(`WorkItem.kv_at` / `kv_blocks` / `kv_copies`); this executor keeps its copy (`BlockTables`)
and allocates nothing.

CUDA graphs: on a CUDA device, when the plan puts the node in a capture region,
decode-only batches (one token per request) that fit a batch bucket replay a captured
graph (`runtime.model_executor.compiled.DecodeGraphs`); everything else — prefill, mixed batches,
batches above the largest bucket, tensor-parallel shards — runs eagerly. On CPU the same
regions and buckets run inductor-compiled steps when the graph sets the node's
`args: {cpu_compile: true}` (compiled at load, before the rank is ready), else eagerly.

Multimodal prompts: a Run whose `embeds` input is set (an encoder's output, (M, hidden))
puts those rows in place of the token embeddings of its placeholder tokens (ids in
`placeholder_ids`; with none declared, every token of the Run is a placeholder). The
embeds a request was given are kept until it closes, so a recompute after preemption
refills every placeholder of its history in order.

Disaggregation: `export_kv(request_id)` hands a request's cache contents and sampling
state to the rank that runs the node next (and frees them here); `import_kv` takes them, written
into the blocks the Run that brings them is told.

Prefix caching (`prefix_cache=True`, the declared executor's default): full blocks are
cached by content (runtime/model_executor/kv/prefix_cache.py) in the conductor's tables, keyed from
the root this executor names (`kv_prefix_key`); a Run's `item.cached` leading tokens sit in reused
blocks of its table and are not computed. Off when the plan reads the node's
hidden states (a cached token has none) unless the executor says its state outputs need no
forward of the cached rows (`states_need_forward = False`), and for subclasses unless they ask
for it. A node fed embeddings caches only with declared `placeholder_ids`, which stop caching
(`kv_prefix_stop_ids`): their ids do not say what was embedded there, unless the executor lets the
conductor name them by the media item a Run reads (`kv_media_ids`, runtime/conductor/media_keys.py:
the Qwen3-Omni thinker).
"""
from __future__ import annotations

import logging
from itertools import accumulate

import torch

from mstar_compiler.plan import DynamicLoopBegin, LoopBegin, Node, Plan
from runtime.model_executor.compiled import DecodeGraphs, capture_buckets
from runtime.model_executor.compiled.cpu_compile import require_cpp_compiler
from runtime.worker.executors import ExecResult, Executor, token_logprobs
from runtime.model_executor.kv import BlockTables, prefix_root
from runtime.model_executor.sampling import GrammarVocab, Sampler, SamplingParams, SamplingState
from runtime.model_executor.sampling.grammar import Constraint
from runtime.transport.messages import KVState, WorkItem
from runtime.transport.request_params import RequestParams

log = logging.getLogger(__name__)


class DecoderLMExecutor(Executor):
    """A decoder LM node on one rank: model, paged cache, block tables, per-request samplers."""

    placeholder_ids: frozenset[int] = frozenset()    # token ids whose rows `embeds` replace (module docstring)
    states_need_forward: bool = True                 # its state outputs come from the forward of every row

    def __init__(self, node: Node, model: torch.nn.Module, rank: int, plan: Plan | None = None,
                 prefix_cache: bool = False) -> None:
        pool = next(p for p in node.kv_pools if p.rank == rank)
        self.node = node
        self.model = model
        self.kv_blocks, self.kv_block_size = pool.num_blocks, pool.block_tokens
        self.cache = model.make_kv_cache(pool.num_blocks, pool.block_tokens)
        self.device = self.cache.k[0].device
        root = None
        if prefix_cache and plan is not None and (not takes_embeds(plan, node) or self.placeholder_ids) \
                and (not self.states_need_forward or not reads_states(plan, node)):
            # the model's identity: equal keys must mean equal KV contents
            root = prefix_root(plan.model, plan.preset, node.name, node.kind, node.preset, node.weights,
                               node.dtype, pool.block_tokens)
        self.prefix_root = root
        self.kv_prefix_key = root.hex() if root is not None else ""
        self.kv_prefix_stop_ids = self.placeholder_ids if root is not None else frozenset()
        self.blocks = BlockTables(pool.num_blocks, pool.block_tokens)
        self._moved_in: dict[int, tuple[KVState, dict[str, torch.Tensor]]] = {}   # caches moved here, not written yet
        self.sampler = Sampler()
        self.vocab: GrammarVocab | None = None        # the tokenizer grammars are matched on (take_vocab)
        self._params: dict[int, SamplingParams] = {}
        self._constraints: dict[int, Constraint] = {}   # a request's grammar matcher until its state takes it
        self._states: dict[int, SamplingState] = {}
        self._embeds: dict[int, list[torch.Tensor]] = {}   # request -> the embeds it was given, in order
        self._prompt_parts: dict[int, list[int]] = {}   # prompt chunks cached before the one that samples
        # subclasses count their own runs around `run`, so they take prompts whole
        self.chunks_prefill = type(self) is DecoderLMExecutor
        self.decode_graphs = self._decode_graphs(plan, rank)

    def _decode_graphs(self, plan: Plan | None, rank: int) -> DecodeGraphs | None:
        """Captured decode steps when on CUDA (compiled ones on CPU with `cpu_compile`) and in a
        capture region of the plan, else None (eager)."""
        buckets = capture_buckets(plan, self.node.name, rank) if plan is not None else ()
        compiled = self.device.type == "cpu" and bool(self.node.args.get("cpu_compile", False))
        if compiled:
            require_cpp_compiler(self.node.name)
        if compiled and not buckets:
            log.warning("node '%s': cpu_compile is on but the plan has no capture region for it on rank %d "
                        "(a decode loop of capture-safe nodes with a batch size): its steps run eagerly",
                        self.node.name, rank)
        if not (self.device.type == "cuda" or compiled) or not buckets:
            return None
        if not getattr(self.model, "is_graph_capturable", False):
            if compiled:
                raise ValueError(f"node '{self.node.name}': cpu_compile needs a dense, unsharded model "
                                 f"({type(self.model).__name__} is MoE or tensor parallel); set cpu_compile: false")
            return None
        if getattr(getattr(self.model, "tp", None), "size", 1) > 1:   # a capture would run collectives alone
            return None
        max_len = int(self.node.dims.get("max_position_embeddings", self.kv_blocks * self.kv_block_size))
        max_blocks = min(self.kv_blocks, -(-max_len // self.kv_block_size))
        graphs = DecodeGraphs(self.model, self.cache, buckets, max_blocks, compiled=compiled)
        graphs.capture_all()
        return graphs

    @property
    def compiled_buckets(self) -> tuple[int, ...]:
        """Batch buckets whose decode step is inductor-compiled (CPU compile), () when none."""
        graphs = self.decode_graphs
        return graphs.prepared_buckets if graphs is not None and graphs.compiled else ()

    def open(self, request_id: int, params: RequestParams) -> None:
        self._params[request_id] = params.sampling
        grammar = params.grammars.get(self.node.name)
        if grammar:     # built here, not in a batch: a grammar the engine refuses fails its request alone
            if self.vocab is None:
                raise ValueError(f"node '{self.node.name}' has no tokenizer to match a grammar on")
            self._constraints[request_id] = self.vocab.constraint(grammar)

    def take_vocab(self, vocab: GrammarVocab) -> bool:
        self.vocab = vocab
        return True

    def close(self, request_id: int, kv_only: bool) -> None:
        if request_id in self.blocks:
            self.blocks.free(request_id)
        self._prompt_parts.pop(request_id, None)
        self._moved_in.pop(request_id, None)
        if not kv_only:
            self._params.pop(request_id, None)
            self._constraints.pop(request_id, None)
            self._states.pop(request_id, None)
            self._embeds.pop(request_id, None)

    def kv_used_blocks(self) -> int:
        return self.blocks.used_blocks()

    def export_kv(self, request_id: int) -> tuple[KVState, dict[str, torch.Tensor]] | None:
        """The request's cache contents and sampling state for another rank (None: none held);
        both are freed here."""
        if request_id not in self.blocks:
            return None
        table = self.blocks.table(request_id)
        idx = torch.tensor(table.blocks, dtype=torch.long, device=self.device)
        tensors = {"k": torch.stack([blocks[idx] for blocks in self.cache.k]).cpu(),   # (L, blocks, bs, kvh, hd)
                   "v": torch.stack([blocks[idx] for blocks in self.cache.v]).cpu()}
        msg = KVState(request_id=request_id, node=self.node.name, num_tokens=table.num_tokens)
        state = self._states.pop(request_id, None)
        if state is not None:
            msg.prompt_ids, msg.output_ids = list(state.prompt_ids), list(state.output_ids)
            tensors["rng"] = state.generator.get_state()
        self.blocks.free(request_id)
        return msg, tensors

    def import_kv(self, msg: KVState, tensors: dict[str, torch.Tensor]) -> None:
        """Take a request's cache contents and sampling state from the rank that held them: written
        when the Run that brings them takes its table (`_reserve`)."""
        self._moved_in[msg.request_id] = (msg, tensors)

    def _write_kv(self, msg: KVState, tensors: dict[str, torch.Tensor]) -> None:
        """A moved cache into the first blocks of its request's table, its sampling state kept."""
        rid = msg.request_id
        idx = torch.tensor(self.blocks.table(rid).blocks[:-(-msg.num_tokens // self.kv_block_size)],
                           dtype=torch.long, device=self.device)
        for layer, (k, v) in enumerate(zip(self.cache.k, self.cache.v)):
            k[idx] = tensors["k"][layer].to(self.device, k.dtype)
            v[idx] = tensors["v"][layer].to(self.device, v.dtype)
        if "rng" in tensors:
            state = SamplingState(self._params.get(rid, SamplingParams()), msg.prompt_ids, self.device,
                                  self._constraints.pop(rid, None))
            state.generator.set_state(tensors["rng"].clone())
            for token in msg.output_ids:
                state.append(token)
            self._states[rid] = state

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]:
        starts = self._reserve(items)
        sampling = [b for b, item in enumerate(items) if not item.partial]
        if self._is_graph_step(items):
            logits, hidden = self._decode_step(items)
        else:
            logits, hidden = self._forward(items, starts, inputs, sampling)
        for item in items:
            if item.partial and item.request_id not in self._states:
                self._prompt_parts.setdefault(item.request_id, []).extend(item.tokens)
        states = [self._state(items[b]) for b in sampling]
        sampled = self.sampler(logits, states) if sampling else None
        tokens = sampled.token_ids.tolist() if sampled is not None else []
        rows = list(accumulate((len(item.tokens) - item.cached for item in items), initial=0))
        results = [ExecResult() for _ in items]
        for i, (b, state, token) in enumerate(zip(sampling, states, tokens)):
            state.append(token)
            done = state.constraint is not None and state.constraint.is_done    # the grammar is complete
            results[b] = ExecResult([token], {"token": torch.tensor([token]), "hidden": hidden[rows[b]:rows[b + 1]]},
                                    logprobs=token_logprobs(sampled, i, state), finished="eos" if done else "")
        return results

    def _is_graph_step(self, items: list[WorkItem]) -> bool:
        # a subclass that wraps `self.model` (its own compute_logits) keeps the eager path
        if self.decode_graphs is None or self.decode_graphs.model is not self.model:
            return False
        if any(len(item.tokens) != 1 or item.partial for item in items):
            return False
        tables = [self.blocks.table(item.request_id) for item in items]
        return self.decode_graphs.can_run([t.blocks for t in tables], [t.num_tokens for t in tables])

    def _forward(self, items: list[WorkItem], starts: list[int],
                 inputs: list[dict[str, torch.Tensor]], sampling: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Eager packed forward over each item's tokens after its cached prefix: (S, vocab) logits of
        the last row of each item in `sampling` (the LM head runs for no other row), (N, hidden) states."""
        new = [item.tokens[item.cached:] for item in items]
        ids = torch.tensor([t for tokens in new for t in tokens], dtype=torch.long, device=self.device)
        positions = torch.cat([self.positions(item, s) for s, item in zip(starts, items)], dim=-1)   # (N,) or (3, N)
        batch = self.blocks.metadata([(item.request_id, len(tokens)) for item, tokens in zip(items, new)],
                                     device=self.device)
        embeds, rows = self._embeds_rows(items, starts, inputs)
        hidden = self.model(ids, positions, batch, self.cache, embeds=embeds, embeds_rows=rows)  # (N, hidden)
        last = batch.last_token_rows()
        if len(sampling) < len(items):
            last = last[torch.tensor(sampling, dtype=torch.long, device=last.device)]
        return self.model.compute_logits(hidden[last]), hidden

    def positions(self, item: WorkItem, start: int) -> torch.Tensor:
        """Rotary positions of the item's tokens after its cached prefix, the first at cache position
        `start`: (n,)."""
        return torch.arange(start, start + len(item.tokens) - item.cached, dtype=torch.long, device=self.device)

    def _embeds_rows(self, items: list[WorkItem], starts: list[int], inputs: list[dict[str, torch.Tensor]]
                     ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Packed (M, hidden) embeds and their (M,) rows in the batch, or (None, None) (module docstring)."""
        embeds, rows, offset = [], [], 0
        for item, start, ins in zip(items, starts, inputs):
            given = self._embeds.setdefault(item.request_id, [])
            if "embeds" in ins:
                given.append(ins["embeds"].to(self.device))
            # a Run from cache position 0 re-feeds a whole history (its reused rows' embeds skipped below)
            held = given if start == item.cached else given[-1:] if "embeds" in ins else []
            at = [i for i, t in enumerate(item.tokens) if not self.placeholder_ids or t in self.placeholder_ids]
            if held and sum(e.shape[0] for e in held) != len(at):
                raise ValueError(f"node '{self.node.name}': request {item.request_id} has {len(at)} placeholder "
                                 f"rows but {sum(e.shape[0] for e in held)} embedding rows to put there")
            if held:    # placeholders among the reused rows are in the cache already
                skip = sum(1 for i in at if i < item.cached)
                embeds.append(torch.cat(held)[skip:])
                rows += [offset + i - item.cached for i in at[skip:]]
            offset += len(item.tokens) - item.cached
        if not embeds:
            return None, None
        return torch.cat(embeds), torch.tensor(rows, dtype=torch.long, device=self.device)

    def _decode_step(self, items: list[WorkItem]) -> tuple[torch.Tensor, torch.Tensor]:
        """A decode-only batch through the captured graphs; hidden copied out of the static buffer."""
        tables = [self.blocks.table(item.request_id) for item in items]
        logits, hidden = self.decode_graphs.run([item.tokens[0] for item in items], [t.blocks for t in tables],
                                                [t.num_tokens for t in tables])
        return logits, hidden.clone()

    def _reserve(self, items: list[WorkItem]) -> list[int]:
        """Each item's table as the conductor told it (a cache moved here written into it), holding
        the item's tokens; the cache position of each item's first computed token."""
        starts = []
        for item in items:
            rid = item.request_id
            self.blocks.take(rid, item.kv_at, item.kv_blocks, item.kv_copies, self.cache)
            moved = self._moved_in.pop(rid, None)
            if moved is not None:
                self._write_kv(*moved)
                self.blocks.hold(rid, moved[0].num_tokens)
            starts.append(self.blocks.grow(rid, len(item.tokens)) + item.cached)
        return starts

    def _state(self, item: WorkItem) -> SamplingState:
        rid = item.request_id
        if rid not in self._states:
            prompt = self._prompt_parts.pop(rid, []) + list(item.tokens)
            self._states[rid] = SamplingState(self._params.get(rid, SamplingParams()), prompt, self.device,
                                               self._constraints.pop(rid, None))
        return self._states[rid]


def reads_states(plan: Plan, node: Node) -> bool:
    """Whether another Run (an edge or a loop carry) or the client (a loop's `emit:`) reads the
    node's outputs other than its tokens: its hidden states, which a cached token has none of."""
    states = {p.name for p in node.outputs if p.dtype != "tokens"}
    read = {(e.src_node, e.src_port) for e in plan.edges}
    for walk in plan.walks:
        for op in walk.program:
            if isinstance(op, (LoopBegin, DynamicLoopBegin)):
                read.update((c.src_node, c.src_port) for c in op.carries)
                read.update((o.node, o.port) for o in op.outputs)
    return any((node.name, port) in read for port in states)


def takes_embeds(plan: Plan, node: Node) -> bool:
    """Whether an edge feeds the node embeddings (audio, images): its placeholder token ids do not
    say what was embedded there, so blocks keyed by tokens alone must not be shared."""
    return any(e.dst_node == node.name and e.dst_port == "embeds" for e in plan.edges)


def decoder_lm_executor(plan: Plan, node: Node, module: torch.nn.Module, rank: int) -> DecoderLMExecutor:
    return DecoderLMExecutor(node, module, rank, plan, prefix_cache=True)
