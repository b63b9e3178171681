"""Runs BAGEL's MoT LM for every node that shares its weights on one rank (worker side).

`llm`, `llm_cfg_text` and `llm_cfg_img` are one module (`same_as`) with three KV
sequences per request: "full", "cfg_text" and "cfg_img" (runtime/models/bagel/__init__.py).
`BagelLMEngine` owns the module, ONE paged cache for all of them (sized as the sum of
their planned pools, which the conductor keeps as one pool: `kv_pool`) and every sequence's
RoPE position; each node gets a thin `BagelLMExecutor` that turns its WorkItems into segments.
The worker hands the engine every batch of its nodes that is queued together (`run_group`), so
the CFG branches of many requests run as one forward.

The engine allocates nothing and decides no reuse: the conductor owns every sequence's block
table (runtime/conductor/kv_ledger.py), counts and keys each Run's rows before it goes out
(runtime/models/bagel/row_keys.py: text by its ids, a picture by the digest of the request's
pixels), and tells the Run its table's changes (`WorkItem.kv_at` / `kv_blocks` / `kv_copies`,
kept in `BlockTables`). A TEXT, VIT or VAE segment the conductor found cached (an earlier
request's prompt, a picture it read, or another CFG branch of this request on the same history,
BAGEL's `cfg_text_context = deepcopy(gen_context)`) comes with `cached` equal to its rows: the
sequence takes them and nothing is computed; otherwise `cached` is 0 and the whole segment runs
(an image's rows attend to each other, so a segment is never computed from its middle).
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from mstar_compiler.plan import Node, Plan
from runtime.models.bagel.generation import Generation, GuidanceUse
from runtime.models.bagel.segments import Segment, SegmentKind
from runtime.worker.executors import ExecResult, Executor, token_logprobs
from runtime.models.bagel.roles import cfg_consumer, segment_kinds
from runtime.model_executor.kv import BlockTables, prefix_root
from runtime.model_executor.sampling import Sampler, SamplingState
from runtime.transport.messages import WorkItem
from runtime.transport.request_params import RequestParams
from runtime.model_executor.parallel.cpu_linear import device_of

log = logging.getLogger(__name__)
SeqId = tuple[int, str]   # (request id, CFG role)


@dataclass
class SegmentSpec:
    """One item's segment before its table is read: what to run on which sequence."""

    seq: SeqId
    kind: SegmentKind
    tokens: list[int] = field(default_factory=list)
    embeds: torch.Tensor | None = None
    latent: torch.Tensor | None = None
    timestep: float = 0.0
    skip: bool = False            # a CFG branch the step's guidance does not use: no forward


class BagelLMEngine:
    """One `bagel_mot_lm` module on one rank and every KV sequence of its nodes."""

    def __init__(self, plan: Plan, module: torch.nn.Module, rank: int, weight_key: str) -> None:
        nodes = [n for n in plan.nodes if n.weight_key == weight_key]
        pools = [p for n in nodes for p in n.kv_pools if p.rank == rank]
        self.module = module
        self.block_size = pools[0].block_tokens
        self.num_blocks = sum(p.num_blocks for p in pools)
        self.cache = module.make_kv_cache(self.num_blocks, self.block_size)
        # the model's identity: equal keys must mean equal KV contents (the conductor keys the rows)
        self.prefix_key = prefix_root("bagel rows", plan.model, plan.preset, weight_key, nodes[0].preset,
                                      nodes[0].weights, nodes[0].dtype, self.block_size).hex()
        # the node the conductor keeps this cache's one pool under: the full branch's, if it is here
        here = [n.name for n in nodes if any(p.rank == rank for p in n.kv_pools)]
        self.pool_node = next((n for n in here if cfg_consumer(plan, n)[1] == "full"), here[0])
        self.tables = BlockTables(self.num_blocks, self.block_size)
        self.ropes: dict[SeqId, int] = {}                  # each sequence's next RoPE position
        self.params: dict[int, RequestParams] = {}
        self.sampler = Sampler()
        self._sampling: dict[int, SamplingState] = {}

    # ---- requests ------------------------------------------------------------------

    def open(self, request_id: int, params: RequestParams) -> None:
        self.params[request_id] = params

    def close(self, seq: SeqId, kv_only: bool) -> None:
        self.tables.free(seq)
        self.ropes.pop(seq, None)
        if not kv_only:
            self.params.pop(seq[0], None)
            self._sampling.pop(seq[0], None)

    def used_blocks(self, role: str) -> int:
        """Blocks the `role` sequences' tables hold (a block several share counts once)."""
        return len({b for seq in self.ropes if seq[1] == role and seq in self.tables
                    for b in self.tables.table(seq).blocks})

    # ---- one forward for several nodes' batches ------------------------------------

    @torch.inference_mode()
    def run_group(self, calls: Sequence[tuple[Any, list, list]]) -> list[list[ExecResult]]:
        """calls: (executor, items, inputs) per queued batch -> their results, in order. They run as one
        forward, but a batch told to copy blocks first (a reused segment's partly filled last block)
        waits for the forward of the batches before it: one of them may write the block it copies."""
        grouped, start = [], 0
        for end in range(1, len(calls) + 1):
            if end == len(calls) or any(item.kv_copies for item in calls[end][1]):
                grouped += self._run(calls[start:end])
                start = end
        return grouped

    def _run(self, calls: Sequence[tuple[Any, list, list]]) -> list[list[ExecResult]]:
        specs = [ex.spec(item, ins) for ex, items, inputs in calls for item, ins in zip(items, inputs)]
        items = [item for _, batch, _ in calls for item in batch]
        segments = {}
        for i, (spec, item) in enumerate(zip(specs, items)):
            self.tables.take(spec.seq, item.kv_at, item.kv_blocks, item.kv_copies, self.cache)
            segment = None if spec.skip else self._segment(spec, item)
            if segment is not None:
                segments[i] = segment
        outputs: dict[int, torch.Tensor | None] = {}
        if segments:
            out = self.module(list(segments.values()), self.cache)
            for i, output, (_, rope) in zip(segments, out.outputs, out.states):
                self.ropes[specs[i].seq] = rope
                outputs[i] = output
        log.debug("bagel_mot_lm: %d batches, %d segments, %d computed", len(calls), len(specs), len(segments))
        results = self._results(specs, outputs)
        grouped, start = [], 0
        for _, batch, _ in calls:
            grouped.append(results[start:start + len(batch)])
            start += len(batch)
        return grouped

    def _segment(self, spec: SegmentSpec, item: WorkItem) -> Segment | None:
        """The spec's Segment on its table (the rows it writes counted in); None when the conductor found
        them all cached (the sequence took them: nothing to compute)."""
        is_text = spec.kind in (SegmentKind.TEXT, SegmentKind.DECODE)
        tokens = torch.tensor(spec.tokens, dtype=torch.long) if is_text else None
        rope = self.ropes.setdefault(spec.seq, 0)
        segment = Segment(spec.kind, self.tables.num_tokens(spec.seq), rope, (), tokens, spec.embeds, spec.latent,
                          spec.timestep)
        if segment.writes_kv:
            rows = segment.num_rows(self.module.patch)
            if item.kv_rows not in (-1, rows):
                raise ValueError(f"request {item.request_id}: the conductor counted {item.kv_rows} KV rows for a "
                                 f"{spec.kind.value} segment of {rows} (runtime/models/bagel/row_keys.py disagrees "
                                 "with what the encoders computed)")
            if item.cached not in (0, rows):
                raise ValueError(f"request {item.request_id}: {item.cached} of the {rows} rows of a {spec.kind.value} "
                                 "segment were reused; a segment is reused whole or computed whole")
            self.tables.grow(spec.seq, rows)
            if item.cached:
                self.ropes[spec.seq] = segment.advanced(self.module.patch)[1]
                return None
        return dataclasses.replace(segment, block_table=tuple(self.tables.table(spec.seq).blocks))

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
        self.kv_prefix_key, self.kv_pool = engine.prefix_key, engine.pool_node

    def open(self, request_id: int, params: RequestParams) -> None:
        self.engine.open(request_id, params)

    def close(self, request_id: int, kv_only: bool) -> None:
        self.engine.close((request_id, self.role), kv_only)

    def kv_used_blocks(self) -> int:
        """Blocks this node's sequences hold in the shared cache (the worker's view, for /metrics)."""
        return self.engine.used_blocks(self.role)

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
