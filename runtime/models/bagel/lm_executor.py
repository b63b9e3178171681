"""Runs BAGEL's MoT LM for every node that shares its weights on one rank (worker side).

`llm`, `llm_cfg_text` and `llm_cfg_img` are one module (`same_as`) with three KV
sequences per request: "full", "cfg_text" and "cfg_img" (runtime/models/bagel/__init__.py).
`BagelLMEngine` owns the module, ONE paged cache for all of them (sized as the sum of
their planned pools) and every sequence's block table, RoPE position and history;
each node gets a thin `BagelLMExecutor` that turns its WorkItems into segments. The
worker hands the engine every batch of its nodes that is queued together
(`run_group`), so the CFG branches of many requests run as one forward.

Prefix sharing, as BAGEL shares it: a sequence about to receive a segment that another
branch of the same request already holds on top of an identical history forks that
branch's blocks instead of recomputing (BAGEL's `cfg_text_context = deepcopy(gen_context)`);
within one call, two branches receiving the same segment on identical histories run it
once and the second forks the first.

Across requests (`prefix_cache`, on by default): every KV row is named by its content
(runtime/models/bagel/row_keys.py) and the cache's blocks are keyed by those rows, chained
from the sequence's start (runtime/model_executor/kv/prefix_cache.py). A TEXT, VIT or VAE segment whose rows
are all cached after the same history (an earlier request's prompt, or an image it read) is
reused whole and not computed (`KVBlockManager.extend`); a segment is never computed from its
middle, as an image's rows attend to each other. Blocks are keyed only after the forward that
wrote them (`commit`); a failed forward's rows are never keyed.
"""
from __future__ import annotations

import dataclasses
import logging
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from mstar_compiler.plan import Node, Plan
from runtime.models.bagel.generation import Generation, GuidanceUse
from runtime.models.bagel.segments import Segment, SegmentKind
from runtime.worker.executors import ExecResult, Executor, token_logprobs
from runtime.models.bagel.roles import cfg_consumer, segment_kinds
from runtime.model_executor.kv import KVBlockManager, PrefixCachingAllocator, PrefixStats, prefix_root
from runtime.models.bagel.row_keys import decode_rows, image_rows, text_rows
from runtime.model_executor.sampling import Sampler, SamplingState
from runtime.transport.messages import WorkItem
from runtime.transport.request_params import RequestParams
from runtime.model_executor.parallel.cpu_linear import device_of

log = logging.getLogger(__name__)
SeqId = tuple[int, str]   # (request id, CFG role)


@dataclass(frozen=True)
class Written:
    """What one KV-writing segment put into a sequence; equal histories share blocks."""

    kind: SegmentKind
    tokens: tuple[int, ...] = ()
    source: weakref.ref | None = None     # the embeds / latent tensor it read

    def same(self, other: Written) -> bool:
        if self.kind is not other.kind or self.tokens != other.tokens:
            return False
        if self.source is None or other.source is None:
            return self.source is other.source
        mine = self.source()
        return mine is not None and mine is other.source()


def same_history(a: Sequence[Written], b: Sequence[Written]) -> bool:
    return len(a) == len(b) and all(x.same(y) for x, y in zip(a, b))


@dataclass
class SeqState:
    rope: int = 0                                      # next RoPE position
    written: list[Written] = field(default_factory=list)


@dataclass
class SegmentSpec:
    """One item's segment before it has cache room: what to run on which sequence."""

    seq: SeqId
    kind: SegmentKind
    tokens: list[int] = field(default_factory=list)
    embeds: torch.Tensor | None = None
    latent: torch.Tensor | None = None
    timestep: float = 0.0
    skip: bool = False            # a CFG branch the step's guidance does not use: no forward

    @property
    def written(self) -> Written | None:
        if self.kind is SegmentKind.GEN:
            return None
        source = self.embeds if self.embeds is not None else self.latent
        return Written(self.kind, tuple(self.tokens), None if source is None else weakref.ref(source))


class BagelLMEngine:
    """One `bagel_mot_lm` module on one rank and every KV sequence of its nodes."""

    def __init__(self, plan: Plan, module: torch.nn.Module, rank: int, weight_key: str,
                 prefix_cache: bool = True) -> None:
        nodes = [n for n in plan.nodes if n.weight_key == weight_key]
        pools = [p for n in nodes for p in n.kv_pools if p.rank == rank]
        self.module = module
        self.block_size = pools[0].block_tokens
        self.num_blocks = sum(p.num_blocks for p in pools)
        self.cache = module.make_kv_cache(self.num_blocks, self.block_size)
        root = None
        if prefix_cache:   # the model's identity: equal keys must mean equal KV contents
            root = prefix_root("bagel rows", plan.model, plan.preset, weight_key, nodes[0].preset,
                               nodes[0].weights, nodes[0].dtype, self.block_size)
        self.blocks = KVBlockManager(self.num_blocks, self.block_size, root)
        # the node that reports this cache's blocks to the conductor (runtime/conductor/kv_ledger.py:
        # branches fork each other's blocks and images are shared by digest, which it cannot foresee)
        here = [n.name for n in nodes if any(p.rank == rank for p in n.kv_pools)]
        self.reporter = next((n for n in here if cfg_consumer(plan, n)[1] == "full"), here[0])
        self.seqs: dict[SeqId, SeqState] = {}
        self.params: dict[int, RequestParams] = {}
        self.sampler = Sampler()
        self._sampling: dict[int, SamplingState] = {}

    # ---- requests ------------------------------------------------------------------

    def open(self, request_id: int, params: RequestParams) -> None:
        self.params[request_id] = params

    def close(self, seq: SeqId, kv_only: bool) -> None:
        if seq in self.blocks:
            self.blocks.free(seq)
        self.seqs.pop(seq, None)
        if not kv_only:
            self.params.pop(seq[0], None)
            self._sampling.pop(seq[0], None)

    def drop_prefix_cache(self) -> None:
        """Cache no prefixes (`mstar-run --no-prefix-cache`); called before any request opens."""
        self.blocks = KVBlockManager(self.num_blocks, self.block_size)

    def used_blocks(self) -> int:
        return self.num_blocks - self.blocks.allocator.num_free

    # ---- one forward for several nodes' batches ------------------------------------

    @torch.inference_mode()
    def run_group(self, calls: Sequence[tuple[Any, list, list]]) -> list[list[ExecResult]]:
        """calls: (executor, items, inputs) per queued batch -> their results, in order."""
        specs = [ex.spec(item, ins) for ex, items, inputs in calls for item, ins in zip(items, inputs)]
        actions = self._sharing(specs)
        for spec, action in zip(specs, actions):
            if action is not None and action[0] == "fork":
                self._fork(action[1], spec.seq)
        todo = [i for i, s in enumerate(specs) if actions[i] is None and not s.skip]
        segments = {i: self._segment(specs[i]) for i in todo}
        computed = [i for i in todo if segments[i] is not None]
        outputs: dict[int, torch.Tensor | None] = {}
        if computed:
            out = self._forward([segments[i] for i in computed], [specs[i].seq for i in computed])
            for i, output, (_, rope) in zip(computed, out.outputs, out.states):
                self._advance(specs[i], rope)
                outputs[i] = output
        for spec, action in zip(specs, actions):
            if action is not None and action[0] == "follow":
                self._fork(specs[action[1]].seq, spec.seq)
        log.debug("bagel_mot_lm: %d batches, %d segments, %d computed", len(calls), len(specs), len(computed))
        results = self._results(specs, outputs)
        grouped, start = [], 0
        for _, items, _ in calls:
            grouped.append(results[start:start + len(items)])
            start += len(items)
        return grouped

    def _sharing(self, specs: list[SegmentSpec]) -> list[tuple[str, Any] | None]:
        """Per spec: None (compute), ("fork", donor seq) or ("follow", index of the spec it copies)."""
        actions: list[tuple[str, Any] | None] = [None] * len(specs)
        for i, spec in enumerate(specs):
            mine = spec.written
            if mine is None or mine.kind is SegmentKind.DECODE:
                continue
            history = self._history(spec.seq)
            donor = next((s for s in self.seqs if s[0] == spec.seq[0] and s != spec.seq
                          and same_history(self.seqs[s].written, [*history, mine])), None)
            if donor is not None:
                actions[i] = ("fork", donor)
                continue
            leader = next((j for j in range(i) if actions[j] is None and specs[j].seq[0] == spec.seq[0]
                           and specs[j].written is not None and specs[j].written.same(mine)
                           and same_history(self._history(specs[j].seq), history)), None)
            if leader is not None:
                actions[i] = ("follow", leader)
        return actions

    def _history(self, seq: SeqId) -> list[Written]:
        state = self.seqs.get(seq)
        return state.written if state else []

    def _fork(self, src: SeqId, dst: SeqId) -> None:
        if dst in self.blocks:
            self.blocks.free(dst)
        self.blocks.fork(src, dst)
        self.seqs[dst] = SeqState(self.seqs[src].rope, list(self.seqs[src].written))

    def _forward(self, segments: list[Segment], seqs: list[SeqId]):
        """One module call; its sequences' new full blocks are cached after it, never after a failure."""
        try:
            out = self.module(segments, self.cache)
        except BaseException:
            for seq in seqs:
                self.blocks.uncache(seq)
            raise
        for seq, seg in zip(seqs, segments):
            if seg.writes_kv:
                self.blocks.commit(seq, tails=True)
        return out

    def _segment(self, spec: SegmentSpec) -> Segment | None:
        """The spec's Segment, with cache room reserved for the rows it writes; None when the
        prefix cache holds them all (the sequence took them, nothing to compute)."""
        if spec.seq not in self.blocks:
            self.blocks.open(spec.seq)
            self.seqs[spec.seq] = SeqState()
        context = self.blocks.num_tokens(spec.seq)
        is_text = spec.kind in (SegmentKind.TEXT, SegmentKind.DECODE)
        tokens = torch.tensor(spec.tokens, dtype=torch.long) if is_text else None
        segment = Segment(spec.kind, context, self.seqs[spec.seq].rope, (), tokens, spec.embeds, spec.latent,
                          spec.timestep)
        if segment.writes_kv:
            reused, copies = self._grow(spec, segment.num_rows(self.module.patch))
            self.cache.copy_blocks(copies)
            if reused:
                self._advance(spec, segment.advanced(self.module.patch)[1])
                return None
        return dataclasses.replace(segment, block_table=tuple(self.blocks.table(spec.seq).blocks))

    def _grow(self, spec: SegmentSpec, num_rows: int) -> tuple[bool, list[tuple[int, int]]]:
        """Room for the spec's rows: (whether the cache held them all, block copies to apply)."""
        if self.blocks.prefix_root is None:
            return False, self.blocks.append(spec.seq, num_rows)
        if spec.kind is SegmentKind.DECODE:   # its logits are the point: always computed
            return False, self.blocks.append(spec.seq, num_rows, decode_rows(spec.tokens[0]))
        if spec.kind is SegmentKind.TEXT:
            rows = text_rows(spec.tokens, self.module.dims["bos_token_id"], self.module.dims["eos_token_id"])
        else:
            rows = image_rows(spec.kind, spec.embeds if spec.kind is SegmentKind.VIT else spec.latent, num_rows)
        return self.blocks.extend(spec.seq, rows)

    def _advance(self, spec: SegmentSpec, rope: int) -> None:
        state = self.seqs[spec.seq]
        state.rope = rope
        if spec.written is not None:
            state.written.append(spec.written)

    # ---- results -------------------------------------------------------------------

    def _results(self, specs: list[SegmentSpec], outputs: dict[int, torch.Tensor | None]) -> list[ExecResult]:
        results = [ExecResult() for _ in specs]
        decodes = [i for i, s in enumerate(specs) if s.kind is SegmentKind.DECODE]
        if decodes:
            states = [self._sampling_state(specs[i].seq[0]) for i in decodes]
            logits = torch.stack([outputs[i] for i in decodes])                 # (B, vocab)
            sampled = self.sampler(logits, states)
            for row, (i, state, token) in enumerate(zip(decodes, states, sampled.token_ids.tolist())):
                state.append(token)
                results[i] = ExecResult([token], {"token": torch.tensor([token])},
                                        logprobs=token_logprobs(sampled, row, state))
        for i, spec in enumerate(specs):
            if spec.kind is SegmentKind.GEN:
                velocity = torch.empty(0) if spec.skip else outputs[i]
                results[i] = ExecResult(outputs={"velocity": velocity})
        return results

    def _sampling_state(self, request_id: int) -> SamplingState:
        if request_id not in self._sampling:
            params = self.params[request_id].sampling
            self._sampling[request_id] = SamplingState(params, device=device_of(self.module))
        return self._sampling[request_id]


class BagelLMExecutor(Executor):
    """One LM node (one CFG role) over its rank's shared engine."""

    def __init__(self, plan: Plan, node: Node, engine: BagelLMEngine, rank: int) -> None:
        pool = next(p for p in node.kv_pools if p.rank == rank)
        self.kv_blocks, self.kv_block_size = pool.num_blocks, pool.block_tokens
        self.engine = self.group = engine      # `group`: the worker runs queued batches of one group together
        self.dims = node.dims
        self.kinds = segment_kinds(plan, node.name)
        cfg, self.role = cfg_consumer(plan, node.name)
        self._cfg = (dict(cfg.args), dict(cfg.param_args)) if cfg is not None else None
        self.name, self.kv_reported = node.name, engine.reporter

    def open(self, request_id: int, params: RequestParams) -> None:
        self.engine.open(request_id, params)

    def close(self, request_id: int, kv_only: bool) -> None:
        self.engine.close((request_id, self.role), kv_only)

    def drop_prefix_cache(self) -> None:
        self.engine.drop_prefix_cache()

    def prefix_stats(self) -> PrefixStats | None:
        """The shared engine's prefix-cache counters, reported once (by the full branch's node)."""
        allocator = self.engine.blocks.allocator
        return allocator.stats if self.role == "full" and isinstance(allocator, PrefixCachingAllocator) else None

    def kv_used_blocks(self) -> int:
        """The shared cache's blocks, counted once (by its reporting node)."""
        return self.engine.used_blocks() if self.name == self.kv_reported else 0

    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]:
        return self.engine.run_group([(self, items, inputs)])[0]

    def spec(self, item: WorkItem, inputs: dict[str, torch.Tensor]) -> SegmentSpec:
        """The segment this node runs for `item` (its kind follows from the item's walk)."""
        kind = self.kinds.get(item.walk, SegmentKind.TEXT)
        seq = (item.request_id, self.role)
        device = device_of(self.engine.module)
        if kind is SegmentKind.GEN:
            return self._gen_spec(seq, item, inputs.get("latent"))
        if kind is SegmentKind.DECODE:   # the answer starts from BAGEL's <|im_start|>
            return SegmentSpec(seq, kind, list(item.tokens[-1:]) or [self.dims["bos_token_id"]])
        if kind is SegmentKind.VIT:
            return SegmentSpec(seq, kind, embeds=inputs["embeds"].to(device))
        if kind is SegmentKind.VAE:
            return SegmentSpec(seq, kind, latent=inputs["latent"].to(device))
        return SegmentSpec(seq, kind, list(item.tokens))

    def _gen_spec(self, seq: SeqId, item: WorkItem, latent: torch.Tensor | None) -> SegmentSpec:
        params = self.engine.params[seq[0]]
        gen = Generation.from_params(params, self.dims)
        t, _ = gen.step_times(item.step)
        device = device_of(self.engine.module)
        if latent is None or latent.numel() == 0:   # the first step starts from the request's noise
            latent = gen.noise(self.dims["latent_channels"], device)
        return SegmentSpec(seq, SegmentKind.GEN, latent=latent.to(device), timestep=t,
                           skip=not self._is_used(params, t))

    def _is_used(self, params: RequestParams, t: float) -> bool:
        """Whether this branch's velocity changes the guided step at time t."""
        if self.role == "full" or self._cfg is None:
            return True
        use = GuidanceUse.of(*self._cfg, params)
        return use.uses_text(t) if self.role == "cfg_text" else use.uses_img(t)
