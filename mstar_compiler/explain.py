"""`mstarc explain`: a plan as a report for people (ranks, weights, KV blocks, programs,
transfers, streams, capture regions)."""
from __future__ import annotations

from mstar_compiler import plan
from mstar_compiler.units import format_size


def explain(p: plan.Plan) -> str:
    """The whole report, deterministic for a given plan."""
    lines = [f"plan {p.model} (from {p.source}, preset {p.preset}, placement {p.placement})",
             f"  format v{p.format_version}, default task {p.default_task}", ""]
    lines += _models(p) + _ranks(p) + _params(p) + _walks(p) + _tasks(p) + _moves(p)
    return "\n".join(lines).rstrip() + "\n"


def _models(p: plan.Plan) -> list[str]:
    """Each included graph's share of the ranks: its nodes' weights and KV blocks, rank by rank."""
    if not p.models:
        return []
    out = [f"models: {len(p.models)} included"]
    for m in p.models:
        nodes = [n for n in p.nodes if n.name.startswith(m.name + ".")]
        out.append(f"  {m.name}: {m.model} (from {m.source}, preset {m.preset}, placement {m.placement}), "
                   f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}, default task {m.default_task}")
        for r in p.ranks:
            here = [n for n in nodes if n.name in r.nodes]
            if here:
                weights = sum(n.weight_bytes // n.placement.tp_size for n in here if n.weight_key == n.name)
                kv = sum(k.num_blocks * k.block_bytes for n in here for k in n.kv_pools if k.rank == r.index)
                out.append(f"    rank {r.index}: weights {format_size(weights)}, KV {format_size(kv)}")
    return out + [""]


def _ranks(p: plan.Plan) -> list[str]:
    out = [f"ranks: {len(p.ranks)}"]
    for r in p.ranks:
        out.append(f"  rank {r.index}: weights {format_size(r.weight_bytes)} ({r.weight_bytes} B), "
                   f"KV {format_size(r.kv_bytes)}, activations {format_size(r.activation_bytes)} kept free, "
                   f"budget {format_size(r.memory_bytes)}")
        for name in r.nodes:
            out.append("    " + _node_line(p.node(name), r.index))
    return out + [""]


def _node_line(n: plan.Node, rank: int) -> str:
    share = n.weight_bytes // n.placement.tp_size
    shared = f" same_as {n.weight_key}" if n.weight_key != n.name else ""
    tp = f" tp={n.placement.tp_size}" if n.placement.tp_size > 1 else ""
    kv = "".join(f", KV {k.num_blocks} blocks x {k.block_tokens} tok" for k in n.kv_pools if k.rank == rank)
    layers = f" ({n.declared_layers} of its {n.published_layers} layers)" if n.published_layers else ""
    quant = f" linears {n.quant}" if n.quant else ""
    weights = n.weights or n.args.get("weights") or "seeded random"       # a kind's own (Silero VAD's wheel file)
    return (f"{n.name}: {n.kind}/{n.preset}{layers} {n.dtype}{quant}{shared}{tp}, {n.num_params:,} params "
            f"({format_size(share)} here){kv}, batch<={n.max_batch}, weights: {weights}")


def _params(p: plan.Plan) -> list[str]:
    out = ["params:"]
    for q in p.params:
        bounds = "" if q.minimum is None and q.maximum is None else f" in [{q.minimum}, {q.maximum}]"
        out.append(f"  {q.name}: {q.type} = {q.default!r}{bounds}")
    return out + [""]


def _count(c: plan.Count) -> str:
    if c.param is None:
        return str(c.const)
    return f"${c.param}" + (f" {'+' if c.offset > 0 else '-'} {abs(c.offset)}" if c.offset else "")


def _op(op: plan.Op) -> str:
    if isinstance(op, plan.Run):
        return f"RUN {op.node} @{op.ranks}"
    if isinstance(op, plan.Parallel):
        return "PARALLEL " + " | ".join(" > ".join(f"{r.node}@{r.ranks}" for r in b) for b in op.branches)
    if isinstance(op, plan.LoopBegin):
        return f"LOOP_BEGIN #{op.loop} x {_count(op.count)} -> end {op.end}" + _loop_extras(op)
    if isinstance(op, plan.DynamicLoopBegin):
        conds = ", ".join(_exit(c) for c in op.until)
        return f"DYNAMIC_LOOP_BEGIN #{op.loop} max {_count(op.max)} until [{conds}] -> end {op.end}" + _loop_extras(op)
    return f"{'DYNAMIC_' if isinstance(op, plan.DynamicLoopEnd) else ''}LOOP_END #{op.loop} -> begin {op.begin}"


def _exit(c: plan.ExitCond) -> str:
    where = f" on {c.node}.{c.port}" if c.node else ""
    value = c.tokens or (f"${c.param}" if c.param else c.value)
    return f"{c.kind}{'=' + str(value) if value not in (None, []) else ''}{where}"


def _loop_extras(op: plan.LoopBegin | plan.DynamicLoopBegin) -> str:
    carries = "; carry " + ", ".join(f"{c.src_node}.{c.src_port}->{c.dst_node}.{c.dst_port}"
                                     for c in op.carries) if op.carries else ""
    emits = "; emit " + ", ".join(f"{o.node}.{o.port}:{o.mode}" for o in op.outputs) if op.outputs else ""
    return carries + emits


def _walks(p: plan.Plan) -> list[str]:
    out = ["walks:"]
    for w in p.walks:
        out.append(f"  {w.name}:")
        out += [f"    {pc:3d}  {_op(op)}" for pc, op in enumerate(w.program)]
        inputs = [f"{r.node}.{r.port}:{r.dtype}{'?' if r.optional else ''}" for r in p.request_inputs
                  if r.walk == w.name]
        if inputs:
            out.append(f"         request inputs: {', '.join(inputs)}")
        out.append(f"         outputs: {', '.join(f'{o.node}.{o.port}:{o.mode}' for o in w.outputs)}")
    return out + [""]


def _cond(c: plan.Cond) -> str:
    text = {"always": "always", "param": f"{c.param} {c.op} {c.value!r}", "input": f"has {c.modality} input",
            "exit": f"exit = {c.reason}"}[c.kind]
    return f"not ({text})" if c.negate else text


def _stage(s: plan.CascadeStage) -> str:
    if s.clauses is None:
        return f"{s.role} {s.task}"
    on = " ".join(repr(d) for d in s.clauses.delimiters)
    return f"{s.role} {s.task} (clauses: delimited on {on}, {s.clauses.min_size}-{s.clauses.size} characters)"


def _tasks(p: plan.Plan) -> list[str]:
    out = ["tasks:"]
    for c in p.cascades:
        out.append(f"  {c.name}: cascade, run by the server: {' -> '.join(_stage(s) for s in c.stages)}")
    for t in p.tasks:
        out.append(f"  {t.name}:")
        for track in t.tracks:
            trigger = f" (per chunk of {track.per_chunk})" if track.per_chunk else ""
            out.append(f"    track {track.name}{trigger}:")
            for s in track.states:
                what = s.walk or (f"for_each input {s.for_each}" if s.for_each else "branch")
                arrows = "; ".join(f"{_cond(x.cond)} -> {'DONE' if x.target == plan.DONE else x.target}"
                                   for x in s.transitions)
                out.append(f"      {s.index}: {what}  [{arrows}]")
    return out + [""]


def _moves(p: plan.Plan) -> list[str]:
    out = ["transfers:" + ("" if p.transfers else " none")]
    for t in p.transfers:
        src = f"{t.src_node}.{t.src_port}" if t.src_port else t.src_node
        dst = f"{t.dst_node}.{t.dst_port}" if t.dst_port else t.dst_node
        out.append(f"  {t.kind}{' in ' + t.walk if t.walk else ''}: {src} @{t.src_rank} -> {dst} @{t.dst_rank}")
    out.append("streams:" + ("" if p.streams or p.task_streams else " none"))
    for s in p.streams:
        pol = s.policy
        shape = {"fixed": f"fixed {pol.size}", "sliding": f"sliding window {pol.size} stride {pol.stride}",
                 "left_context": f"left_context chunk {pol.size} context {pol.context}"}[pol.kind]
        src = "pushed by the server" if s.is_client_fed else f"@{s.src_rank}"
        out.append(f"  {s.name}: {s.src_node}.{s.src_port} {src} -> {s.dst_node}.{s.dst_port} "
                   f"@{s.dst_rank}, {shape}, buffer {s.capacity} items")
    for t in p.task_streams:
        pol = t.policy
        out.append(f"  {t.name}: client.{t.item} pushed by the server -> task {t.task} ({t.input}), a request per "
                   f"clause: delimited on {' '.join(repr(d) for d in pol.delimiters)}, "
                   f"{pol.min_size}-{pol.size} characters")
    out.append("capture regions:" + ("" if p.capture_regions else " none"))
    for c in p.capture_regions:
        out.append(f"  {c.walk} loop #{c.loop} @rank {c.rank}: {', '.join(c.nodes)} buckets {c.batch_buckets}")
    return out
