"""Look-up tables over a plan, built once: where each Run's inputs come from, what it emits.

The conductor asks these per dispatched item, so they are dicts, not scans.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from mstar_compiler.plan import Count, DynamicLoopBegin, LoopBegin, Node, Parallel, Plan, Run

# Port dtypes the conductor keeps itself (small ints, needed for streaming and stop checks);
# every other dtype stays on the workers and moves worker -> worker.
CONDUCTOR_DTYPES = ("tokens",)
# Tensor outputs a client receives (hidden states stay inside the model).
CLIENT_DTYPES = ("image", "audio", "video", "latent", "actions", "codes")


@dataclass(frozen=True)
class Source:
    """Where one input port of a Run reads from: a value key, or the request's own input."""

    key: str              # "<node>.<port>" of the producer, or "input:<node>.<port>"
    is_request_input: bool


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What every Run of one node in one walk needs to know, built once (`PlanIndex.facts`) and
    read per dispatched item and per result instead of asking the index each question."""

    ports: tuple[tuple[str, tuple[Source, ...], bool], ...]  # (input port, its sources, is a token port)
    client_tokens: bool                 # its tokens go to the client
    client_tensors: tuple[str, ...]     # output ports whose tensors go to the client
    token_budget: Count | None          # the loop `max` bounding the client's tokens from the node
    has_kv: bool                        # the node keeps a KV cache
    is_tp: bool                         # its ranks form one tensor-parallel group
    is_replicated: bool                 # its ranks are data-parallel replicas (pick one per request)
    has_routes: bool                    # some of its outputs cross to another rank in this walk
    fed_back: str | None = None         # its one input port takes tokens, first from this value of a node
                                        # (a decode loop's last token): bound without asking each source


class PlanIndex:
    """Per (walk, node): input sources, cross-rank routes, client outputs."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.nodes: dict[str, Node] = {n.name: n for n in plan.nodes}
        self._sources: dict[tuple[str, str], dict[str, list[Source]]] = {}
        self._emits: dict[tuple[str, str], set[str]] = {}
        self._loop_emits: dict[tuple[str, str], set[str]] = {}   # declared `emit:` of loops (any dtype)
        for walk in plan.walks:
            for name in walk.nodes:
                self._sources[(walk.name, name)] = self._build_sources(walk.name, name)
            outs = list(walk.outputs)
            for op in walk.program:
                if isinstance(op, (LoopBegin, DynamicLoopBegin)):
                    outs.extend(op.outputs)
                    for out in op.outputs:
                        self._loop_emits.setdefault((walk.name, out.node), set()).add(out.port)
            for out in outs:
                self._emits.setdefault((walk.name, out.node), set()).add(out.port)
        self.batch_keys = self._batch_keys()
        # loops whose body runs several nodes: their rows on a rank move as one cohort (Scheduler._place), from one
        # op of the body to the next; node -> the index of its op (a Parallel's branches share their op's)
        self.cohort_ops: dict[str, dict[str, int]] = {w.name: _op_of_node(w.program) for w in plan.walks
                                                      if len(set(w.nodes)) > 1 and any(
                                                          isinstance(op, (LoopBegin, DynamicLoopBegin))
                                                          for op in w.program)}
        # answers asked per dispatched item, memoised (the plan never changes)
        self._client_tokens: dict[tuple[str, str], bool] = {}
        self._client_tensors: dict[tuple[str, str], list[str]] = {}
        self._routes: dict[tuple[str, str, int], list[tuple[str, int]]] = {}
        # (node, is_output) -> names of its ports the conductor keeps itself (asked per item)
        self._token_ports = {(n.name, out): frozenset(p.name for p in (n.outputs if out else n.inputs)
                                                      if p.dtype in CONDUCTOR_DTYPES)
                             for n in plan.nodes for out in (False, True)}
        self._output_keys = {n.name: self._build_output_keys(n) for n in plan.nodes}
        # nodes placed as data-parallel replicas (several ranks, no tensor parallelism)
        self.replicated = frozenset(n.name for n in plan.nodes if n.placement.tp_size == 1 and any(
            len(ranks) > 1 for ranks in (n.placement.ranks, *n.placement.walk_ranks.values())))
        self._tensor_sources = self._nodes_read_for_tensors()
        self.token_budgets = self._token_budgets()
        self.facts_memo: dict[tuple[str, str], RunFacts] = {}     # `facts`' answers so far

    def facts(self, walk: str, node: str) -> RunFacts:
        """The `RunFacts` of a Run of `node` in `walk` (memoised: the plan never changes)."""
        found = self.facts_memo.get((walk, node))
        if found is None:
            client_tokens = self.client_tokens(walk, node)
            ports = tuple((port, tuple(sources), self.is_token_port(node, port, output=False))
                          for port, sources in self.sources(walk, node).items())
            spec = self.nodes[node]
            found = self.facts_memo[(walk, node)] = RunFacts(
                ports, client_tokens, tuple(self.client_tensors(walk, node)),
                self.token_budgets.get(node) if client_tokens else None,
                has_kv=spec.has_kv_cache, is_tp=spec.placement.tp_size > 1, is_replicated=node in self.replicated,
                has_routes=any(t.kind in ("edge", "carry") and t.walk == walk and t.src_node == node
                               and t.dst_rank != t.src_rank for t in self.plan.transfers),
                fed_back=ports[0][1][0].key if len(ports) == 1 and ports[0][2] and ports[0][1]
                and not ports[0][1][0].is_request_input else None)
        return found

    def _token_budgets(self) -> dict[str, Count]:
        """node -> the `max` of the DynamicLoop whose body emits the node's client tokens: the most
        tokens a request's client gets from that node, counting those emitted before the loop
        (a prefill's first token), as OpenAI's `max_tokens` counts them."""
        budgets: dict[str, Count] = {}
        for walk in self.plan.walks:
            program = walk.program
            for i, op in enumerate(program):
                if not isinstance(op, DynamicLoopBegin):
                    continue
                for body in program[i + 1:op.end]:
                    runs = [body] if isinstance(body, Run) else \
                        [r for b in body.branches for r in b] if isinstance(body, Parallel) else []
                    for run in runs:
                        if self.client_tokens(walk.name, run.node):
                            budgets.setdefault(run.node, op.max)
        return budgets

    def _build_sources(self, walk: str, node: str) -> dict[str, list[Source]]:
        """input port -> candidate sources in precedence order: carry, edge, request input."""
        out: dict[str, list[Source]] = {}
        program = self.plan.walk(walk).program
        for op in program:
            if isinstance(op, (LoopBegin, DynamicLoopBegin)):
                for c in op.carries:
                    if c.dst_node == node:
                        out.setdefault(c.dst_port, []).append(Source(f"{c.src_node}.{c.src_port}", False))
        for e in self.plan.edges:
            if e.walk == walk and e.dst_node == node:
                out.setdefault(e.dst_port, []).append(Source(f"{e.src_node}.{e.src_port}", False))
        for ri in self.plan.request_inputs:
            if ri.walk == walk and ri.node == node:
                out.setdefault(ri.port, []).append(Source(f"input:{node}.{ri.port}", True))
        return out

    def sources(self, walk: str, node: str) -> dict[str, list[Source]]:
        return self._sources.get((walk, node), {})

    def is_token_port(self, node: str, port: str, *, output: bool) -> bool:
        return port in self._token_ports[(node, output)]

    def port_dtype(self, node: str, port: str) -> str:
        """dtype of an input port ("tokens", "image", "latent", ...)."""
        return next(p.dtype for p in self.nodes[node].inputs if p.name == port)

    def output_keys(self, node: str) -> tuple[list[str], list[str]]:
        """The value keys "<node>.<port>" of the node's token outputs and of its other outputs (asked per batch)."""
        return self._output_keys[node]

    def _build_output_keys(self, node: Node) -> tuple[list[str], list[str]]:
        tokens = self._token_ports[(node.name, True)]
        return ([f"{node.name}.{p.name}" for p in node.outputs if p.name in tokens],
                [f"{node.name}.{p.name}" for p in node.outputs if p.name not in tokens])

    def client_tokens(self, walk: str, node: str) -> bool:
        """Whether tokens this node produces in this walk go to the client."""
        key = (walk, node)
        if key not in self._client_tokens:
            self._client_tokens[key] = any(self.is_token_port(node, p, output=True) for p in self._emits.get(key, ()))
        return self._client_tokens[key]

    def client_tensors(self, walk: str, node: str) -> list[str]:
        """Output ports whose tensors this node sends back to the client in this walk."""
        key = (walk, node)
        if key not in self._client_tensors:
            self._client_tensors[key] = self._find_client_tensors(walk, node)
        return list(self._client_tensors[key])

    def _find_client_tensors(self, walk: str, node: str) -> list[str]:
        ports = self._emits.get((walk, node), set())
        declared = self._loop_emits.get((walk, node), set())   # e.g. a rollout's predicted frames (hidden)
        return sorted(p.name for p in self.nodes[node].outputs
                      if (p.name in ports and p.dtype in CLIENT_DTYPES)
                      or (p.name in declared and p.dtype not in CONDUCTOR_DTYPES))

    def routes(self, walk: str, node: str, rank: int) -> list[tuple[str, int]]:
        """(output port, consumer rank) for every cross-rank edge or loop carry this Run feeds."""
        key = (walk, node, rank)
        if key not in self._routes:
            self._routes[key] = sorted({(t.src_port, t.dst_rank) for t in self.plan.transfers
                                        if t.kind in ("edge", "carry") and t.walk == walk and t.src_node == node
                                        and t.src_rank == rank and t.dst_rank != rank})
        return self._routes[key]

    def _batch_keys(self) -> frozenset[tuple[int, str]]:
        """Every (rank, node) a batch can be formed for: each replica, a TP group's lead rank."""
        keys = set()
        for node in self.plan.nodes:
            for ranks in (node.placement.ranks, *node.placement.walk_ranks.values()):
                keys.update((r, node.name) for r in (ranks[:1] if node.placement.tp_size > 1 else ranks))
        return frozenset(keys)

    def _nodes_read_for_tensors(self) -> frozenset[str]:
        """Nodes some edge, carry or stream reads a non-token output of (anywhere in the plan)."""
        read = [(e.src_node, e.src_port) for e in self.plan.edges]
        read += [(s.src_node, s.src_port) for s in self.plan.streams if not s.is_client_fed]
        read += [(c.src_node, c.src_port) for w in self.plan.walks for op in w.program
                 if isinstance(op, (LoopBegin, DynamicLoopBegin)) for c in op.carries]
        return frozenset(n for n, p in read if not self.is_token_port(n, p, output=True))

    def can_chunk_prefill(self, node: str) -> bool:
        """Whether a prompt Run of `node` may be cut into chunks: a KV node whose only outputs
        anything reads are tokens (a chunk's hidden states would reach no consumer whole)."""
        return self.nodes[node].has_kv_cache and node not in self._tensor_sources

    def kv_nodes(self) -> list[Node]:
        return [n for n in self.plan.nodes if n.has_kv_cache]

    def cohorts_of(self, walks: Iterable[str]) -> frozenset[str]:
        """Those of `walks` (a batch's rows') that are loops of several nodes (`cohort_ops`)."""
        ops = self.cohort_ops
        return frozenset(w for w in walks if w in ops) if ops else frozenset()


def _op_of_node(program: list) -> dict[str, int]:
    """node -> the index of the first op of `program` that runs it (a Parallel's branches: the Parallel's)."""
    ops: dict[str, int] = {}
    for pc, op in enumerate(program):
        runs = [run for branch in op.branches for run in branch] if isinstance(op, Parallel) else [op]
        for run in runs:
            if isinstance(run, Run):
                ops.setdefault(run.node, pc)
    return ops
