"""Typecheck helpers for loops (carries, emits, exit conditions), Parallel branches,
streaming edges and per-chunk tracks.
"""
from __future__ import annotations

from mstar_compiler import plan
from mstar_compiler.ir import IR, LoopStep, NodeStep, ParStep, SeqStep, Step, StreamIR
from mstar_compiler.passes.typecheck_ports import check_compatible, describe, port

_TOKEN_DTYPES = ("tokens", "codes")   # outputs eos/stop_token conditions can test, in order of preference


def walk_nodes(step: Step) -> list[str]:
    """Every node a walk (or step) runs, in program order, once each."""
    out: list[str] = []
    for node in _iter_nodes(step):
        if node not in out:
            out.append(node)
    return out


def _iter_nodes(step: Step):
    if isinstance(step, NodeStep):
        yield step.node
    elif isinstance(step, ParStep):
        for branch in step.branches:
            for s in branch:
                yield s.node
    elif isinstance(step, LoopStep):
        yield from _iter_nodes(step.body)
    else:
        for s in step.steps:
            yield from _iter_nodes(s)


def loops(step: Step) -> list[LoopStep]:
    """Every loop in a walk, outer before inner, program order."""
    if isinstance(step, LoopStep):
        return [step, *loops(step.body)]
    if isinstance(step, SeqStep):
        return [inner for s in step.steps for inner in loops(s)]
    return []


def check_loop(ir: IR, loop: LoopStep) -> None:
    """Carries, emits and exit conditions refer to ports of nodes in the loop body."""
    body = walk_nodes(loop.body)
    for c in loop.carries:
        _in_body(ir, c.carry.src_node, body, c.path, "carry source")
        _in_body(ir, c.carry.dst_node, body, c.path, "carry destination")
        src = port(ir, c.carry.src_node, c.carry.src_port, output=True, path=c.path, key=True)
        dst = port(ir, c.carry.dst_node, c.carry.dst_port, output=False, path=c.path)
        check_compatible(ir, src, dst, f"{c.carry.src_node}.{c.carry.src_port}",
                         f"{c.carry.dst_node}.{c.carry.dst_port}", c.path)
    for e in loop.emits:
        _in_body(ir, e.output.node, body, e.path, "emitted node")
        port(ir, e.output.node, e.output.port, output=True, path=e.path, key=True)
    token_conds = [i for i, c in enumerate(loop.until) if c.kind in ("eos", "stop_token")]
    if token_conds:
        watch = _watch(ir, loop, body)
        for i in token_conds:
            loop.until[i] = plan.ExitCond(**{**_fields(loop.until[i]), "node": watch[0], "port": watch[1]})


def _fields(cond: plan.ExitCond) -> dict:
    return {f: getattr(cond, f) for f in cond.__struct_fields__}


def _watch(ir: IR, loop: LoopStep, body: list[str]) -> tuple[str, str]:
    if loop.watch is not None:
        node, name = loop.watch
        _in_body(ir, node, body, (*loop.path, "watch"), "watched node")
        p = port(ir, node, name, output=True, path=(*loop.path, "watch"))
        if p.dtype not in _TOKEN_DTYPES:
            raise ir.doc.error(f"watch {node}.{name} is {p.dtype}; eos/stop_token test a tokens or codes output",
                               (*loop.path, "watch"))
        return node, name
    for dtype in _TOKEN_DTYPES:
        for node in reversed(body):
            for p in ir.nodes[node].outputs:
                if p.dtype == dtype:
                    return node, p.name
    raise ir.doc.error("`until: eos`/`stop_token` needs a node with a tokens or codes output in the loop body",
                       (*loop.path, "until"), "add `watch: node.port`, or use `horizon:`")


def _in_body(ir: IR, node: str, body: list[str], path, what: str) -> None:
    if node not in body:
        raise ir.doc.error(f"{what} '{node}' is not in this loop's body", path,
                           f"the body runs: {', '.join(body)}", key=True)


def check_branches_agree(ir: IR, step: ParStep, ends: list[str]) -> None:
    """Every branch of a Parallel ends with outputs of the same dtypes and shapes."""
    first = [describe(p).split(": ", 1)[1] for p in ir.nodes[ends[0]].outputs]
    for i, end in enumerate(ends[1:], start=1):
        other = [describe(p).split(": ", 1)[1] for p in ir.nodes[end].outputs]
        if other != first:
            raise ir.doc.error(f"Parallel branches disagree: branch 0 ends with {first}, branch {i} with {other}",
                               (*step.path, "parallel", i), "Parallel gathers like outputs (e.g. CFG velocities)")


def check_stream(ir: IR, s: StreamIR) -> None:
    """A stream runs from an output (or its client) to a stream input of a compatible type,
    cut as the input's kind needs (`Port.chunk`)."""
    dst = port(ir, s.dst_node, s.dst_port, output=False, path=(*s.path, "to"))
    if not dst.stream:
        streams = [p.name for p in ir.nodes[s.dst_node].inputs if p.stream]
        raise ir.doc.error(f"stream '{s.name}' ends at {s.dst_node}.{s.dst_port}, which is not a stream port",
                           (*s.path, "to"), f"stream inputs of '{s.dst_node}': {', '.join(streams) or 'none'}")
    if s.src_node != plan.CLIENT:     # a client-fed stream's items are what its consumer's port reads
        src = port(ir, s.src_node, s.src_port, output=True, path=(*s.path, "from"))
        check_compatible(ir, src, dst, f"{s.src_node}.{s.src_port}", f"{s.dst_node}.{s.dst_port}", s.path)
    _check_chunk(ir, s)


def _check_chunk(ir: IR, s: StreamIR) -> None:
    """A port that computes on whole windows takes exactly `fixed: <its window>` chunks."""
    spec = next(p for p in ir.nodes[s.dst_node].spec.inputs if p.name == s.dst_port)
    if not spec.chunk:
        return
    size = ir.nodes[s.dst_node].dims[spec.chunk]
    if s.policy.kind != "fixed" or s.policy.size != size:
        written = f"{s.policy.kind}: {s.policy.size}" if s.policy.kind == "fixed" else s.policy.kind
        raise ir.doc.error(f"stream '{s.name}' is cut as {written}, but {s.dst_node}.{s.dst_port} "
                           f"({ir.nodes[s.dst_node].kind}) computes on windows of {spec.chunk} = {size} items",
                           s.policy_path or (*s.path, "policy"),
                           f"write `fixed: {size}` (a graph preset may set it: presets.<preset>.streams)")


def check_tracks(ir: IR) -> None:
    """A per-chunk track's walk runs the stream's consumer; a client-fed stream has such a track."""
    read = {track.per_chunk for task in ir.tasks.values() for track in task.tracks}
    for s in ir.streams.values():
        if s.src_node == plan.CLIENT and s.name not in read:
            raise ir.doc.error(f"client-fed stream '{s.name}' is read by no task", (*s.path, "from"),
                               f"add a track `{{per_chunk: {s.name}, do: <a walk running {s.dst_node}>}}` to a task")
    for task in ir.tasks.values():
        for track in task.tracks:
            if track.per_chunk is None:
                continue
            stream = ir.streams[track.per_chunk]
            walk = track.steps[0].walk
            if stream.dst_node not in walk_nodes(ir.walks[walk]):
                raise ir.doc.error(f"track '{track.name}' runs walk '{walk}' per chunk of '{stream.name}', "
                                   f"but that walk does not run '{stream.dst_node}'", (*track.path, "do"),
                                   f"the walk must run the stream's consumer '{stream.dst_node}'")
