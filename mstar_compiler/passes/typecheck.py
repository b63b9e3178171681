"""Pass 4, typecheck: ports with shapes resolved from preset dims; every edge (implied by
Sequential order, declared, streamed, or loop-carried) joins compatible ports.

Implied edges: in a Sequential, the outputs of the previous step's producers (in order;
a Parallel contributes the last node of each branch, in branch order) feed the next
node's first unfed, non-stream input of the same dtype. A node that follows another
must receive at least one edge from it. Inputs nothing feeds become request inputs
(required ones, optional ones of a request dtype, and loop-carried ones for iteration 0).
"""
from __future__ import annotations

from mstar_compiler import plan
from mstar_compiler.errors import Path
from mstar_compiler.ir import IR, LoopStep, NodeIR, NodeStep, ParStep, SeqStep, Step
from mstar_compiler.passes import cascades, task_streams, typecheck_loops, typecheck_ports
from mstar_compiler.passes.typecheck_ports import check_compatible, port

# dtypes a request itself can carry (prompt tokens, media); optional inputs of these
# dtypes that nothing feeds are listed as request inputs too.
REQUEST_DTYPES = ("tokens", "text", "image", "audio", "video", "actions")


def run(ir: IR) -> IR:
    for node in ir.nodes.values():
        typecheck_ports.resolve_ports(ir, node)
    for decl in ir.edge_decls:
        src = port(ir, decl.src_node, decl.src_port, output=True, path=decl.path)
        dst = port(ir, decl.dst_node, decl.dst_port, output=False, path=decl.path)
        check_compatible(ir, src, dst, f"{decl.src_node}.{decl.src_port}", f"{decl.dst_node}.{decl.dst_port}", decl.path)
        if decl.src_node == decl.dst_node:
            raise ir.doc.error(f"edge {decl.src_node}.{decl.src_port} -> {decl.dst_node}.{decl.dst_port} "
                               "is a cycle outside a Loop", decl.path,
                               f"inside a loop write it as carry: {{{decl.src_node}.{decl.src_port}: "
                               f"{decl.dst_node}.{decl.dst_port}}}")
    for stream in ir.streams.values():
        typecheck_loops.check_stream(ir, stream)
    for name, walk in ir.walks.items():
        _Walk(ir, name, walk).check()
    typecheck_loops.check_tracks(ir)
    task_streams.check(ir)
    cascades.check(ir)
    return ir


class _Walk:
    """Implied edges, declared edges and request inputs of one walk."""

    def __init__(self, ir: IR, name: str, walk: SeqStep) -> None:
        self.ir = ir
        self.name = name
        self.walk = walk
        self.nodes = typecheck_loops.walk_nodes(walk)
        self.ran: set[str] = set()
        self.fed: dict[tuple[str, str], str] = {}
        self.stream_inputs = {(s.dst_node, s.dst_port) for s in ir.streams.values()}

    def check(self) -> None:
        frontier = self._seq(self.walk, [])
        outputs = [e.output for loop in typecheck_loops.loops(self.walk) for e in loop.emits]
        for producer in frontier:
            emitted = {(o.node, o.port) for o in outputs}
            outputs += [plan.LoopOutput(producer, p.name, "last") for p in self.ir.nodes[producer].outputs
                        if (producer, p.name) not in emitted]
        self.ir.walk_outputs[self.name] = outputs
        carried = {(c.carry.dst_node, c.carry.dst_port) for loop in typecheck_loops.loops(self.walk)
                   for c in loop.carries}
        for node in self.nodes:
            for p in self.ir.nodes[node].inputs:
                key = (node, p.name)
                if key in self.fed or key in self.stream_inputs:
                    continue
                if not p.optional or p.dtype in REQUEST_DTYPES or key in carried:
                    self.ir.request_inputs.append(plan.RequestInput(self.name, node, p.name, p.dtype, p.optional))

    def _seq(self, seq: SeqStep, frontier: list[str]) -> list[str]:
        for step in seq.steps:
            frontier = self._visit(step, frontier)
        return frontier

    def _visit(self, step: Step, frontier: list[str]) -> list[str]:
        if isinstance(step, NodeStep):
            self._connect(frontier, step.node, step.path)
            self.ran.add(step.node)
            return [step.node]
        if isinstance(step, ParStep):
            ends: list[str] = []
            for branch in step.branches:
                ends += self._seq(SeqStep(list(branch), step.path), frontier)
            typecheck_loops.check_branches_agree(self.ir, step, ends)
            return ends
        if isinstance(step, LoopStep):
            typecheck_loops.check_loop(self.ir, step)
            return self._seq(step.body, frontier)
        return self._seq(step, frontier)

    def _connect(self, frontier: list[str], dst: str, path: Path) -> None:
        received = self._declared(dst, frontier)
        node = self.ir.nodes[dst]
        for producer in frontier:
            for out in self.ir.nodes[producer].outputs:
                target = self._first_unfed(node, out.dtype)
                if target is None:
                    continue
                check_compatible(self.ir, out, target, f"{producer}.{out.name}", f"{dst}.{target.name}", path)
                self._add(producer, out.name, dst, target.name, True)
                received.add(producer)
        missing = [p for p in frontier if p not in received]
        if missing:
            raise self._no_fit(missing[0], node, path)

    def _declared(self, dst: str, frontier: list[str]) -> set[str]:
        received: set[str] = set()
        for decl in self.ir.edge_decls:
            if decl.dst_node != dst or decl.src_node not in self.nodes:
                continue
            if decl.src_node not in self.ran:
                raise self.ir.doc.error(
                    f"edge {decl.src_node}.{decl.src_port} -> {dst}.{decl.dst_port} runs backwards in walk "
                    f"'{self.name}' ({dst} runs before {decl.src_node}): a cycle outside a Loop", decl.path,
                    "inside a loop, write it as `carry:`; otherwise reorder the walk")
            self._add(decl.src_node, decl.src_port, dst, decl.dst_port, False)
            received.add(decl.src_node)
        return received

    def _first_unfed(self, node: NodeIR, dtype: str) -> plan.Port | None:
        for p in node.inputs:
            key = (node.name, p.name)
            if p.dtype == dtype and key not in self.fed and key not in self.stream_inputs:
                return p
        return None

    def _add(self, src: str, sport: str, dst: str, dport: str, implied: bool) -> None:
        key = (dst, dport)
        if key in self.fed:
            return
        self.fed[key] = src
        self.ir.edges.append(plan.Edge(self.name, src, sport, dst, dport, implied))

    def _no_fit(self, producer: str, node: NodeIR, path: Path):
        outs = ", ".join(typecheck_ports.describe(p) for p in self.ir.nodes[producer].outputs) or "none"
        ins = ", ".join(typecheck_ports.describe(p) for p in node.inputs) or "none"
        return self.ir.doc.error(
            f"in walk '{self.name}', no output of '{producer}' ({outs}) fits an unfed input of "
            f"'{node.name}' ({ins})", path,
            "declare the edge under `edges:` (src.port -> dst.port), or put a node between them")
