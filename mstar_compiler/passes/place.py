"""Pass 6, place: the chosen placement profile to ranks per node (and per walk), TP groups
and data-parallel replicas; `Run` ops get their ranks; cross-rank edges, loop carries,
streams and KV hand-overs between walks become transfers.
"""
from __future__ import annotations

from typing import Any

from mstar_compiler import plan
from mstar_compiler.errors import Path, did_you_mean
from mstar_compiler.ir import IR, NodeIR
from mstar_compiler.passes.typecheck_loops import walk_nodes


def run(ir: IR) -> IR:
    profile, ppath = _profile(ir)
    for name in profile:
        if name != "*" and name not in ir.nodes and not (name.endswith(".*") and name[:-2] in ir.includes):
            raise ir.doc.error(f"placement '{ir.placement_name}' places unknown node '{name}'", (*ppath, name),
                               did_you_mean(name, [*ir.nodes, *(f"{i}.*" for i in ir.includes)]), key=True)
    highest = 0
    for node in ir.nodes.values():
        node.placement, spath = _placement(ir, node, *_rank_spec(ir, node.name, profile, ppath))
        for rank_list, path in _rank_lists(node.placement, spath):
            highest = max(highest, _check_ranks(ir, rank_list, path))
    ir.num_ranks = ir.options.devices or highest + 1
    for name, program in ir.programs.items():
        ir.programs[name] = [_place_op(ir, op, name) for op in program]
    ir.transfers = _transfers(ir)
    return ir


def _profile(ir: IR) -> tuple[dict[str, Any], Path]:
    profiles = ir.doc.data.get("placements", {})
    if not profiles:
        return {"*": 0}, ()
    return profiles[ir.placement_name], ("placements", ir.placement_name)


def _as_list(ranks: int | list[int]) -> list[int]:
    return list(ranks) if isinstance(ranks, list) else [ranks]


def _rank_spec(ir: IR, node: str, profile: dict[str, Any], ppath: Path) -> tuple[Any, Path]:
    """The rank spec placing `node` and where it is written: this graph's profile names it (or its
    include: `llm.*`), else the profile of the graph that declares it (outermost include first), else
    this profile's `"*"`."""
    key = _key(profile, node)
    if key:
        return profile[key], (*ppath, key)
    for prefix, inc in sorted(ir.includes.items(), key=lambda kv: kv[0].count(".")):
        if node.startswith(prefix + ".") and (key := _key(inc.profile, node)):
            return inc.profile[key], (*inc.profile_path, key[len(prefix) + 1:])   # the key as its file writes it
    if "*" not in profile:
        raise ir.doc.error(f"placement '{ir.placement_name}' gives no rank to node '{node}'", ppath,
                           f"add `{node}: 0` or a default `\"*\": 0`")
    return profile["*"], (*ppath, "*")


def _key(profile: dict[str, Any], node: str) -> str:
    """The key of `profile` naming `node`: itself, or `<include>.*` of the nearest include declaring it."""
    if node in profile:
        return node
    parts = node.split(".")
    return next((k for i in range(len(parts) - 1, 0, -1) if (k := ".".join(parts[:i]) + ".*") in profile), "")


def _placement(ir: IR, node: NodeIR, raw: Any, path: Path) -> tuple[plan.Placement, Path]:
    spec = raw if isinstance(raw, dict) else {"ranks": raw}
    ranks, tp = _as_list(spec["ranks"]), spec.get("tp", 1)
    if len(set(ranks)) != len(ranks):
        raise ir.doc.error(f"rank listed twice for node '{node.name}'", path)
    if tp > 1:
        _check_tp(ir, node, tp, len(ranks), (*path, "tp") if isinstance(raw, dict) else path)
    walk_ranks: dict[str, list[int]] = {}
    runs_in = [w for w, seq in ir.walks.items() if node.name in walk_nodes(seq)]
    for walk, wr in spec.get("walks", {}).items():
        if walk not in runs_in:
            raise ir.doc.error(f"node '{node.name}' does not run in walk '{walk}'", (*path, "walks", walk),
                               did_you_mean(walk, runs_in), key=True)
        if tp > 1 and len(_as_list(wr)) != tp:
            raise ir.doc.error(f"walk '{walk}' places '{node.name}' on {len(_as_list(wr))} ranks, its tp is {tp}",
                               (*path, "walks", walk))
        walk_ranks[walk] = _as_list(wr)
    return plan.Placement(ranks, tp, walk_ranks), path


def _check_tp(ir: IR, node: NodeIR, tp: int, num_ranks: int, path: Path) -> None:
    if num_ranks != tp:
        raise ir.doc.error(f"tp: {tp} needs {tp} ranks for node '{node.name}', got {num_ranks}", path,
                           f"list {tp} ranks: ranks: {list(range(tp))}")
    if not node.spec.tp_divides:
        raise ir.doc.error(f"kind '{node.kind}' does not support tensor parallelism", path,
                           "use tp: 1 (several ranks then hold data-parallel replicas)")
    for key in node.spec.tp_divides:
        value = node.dims.get(key)
        if not isinstance(value, int) or value % tp:
            raise ir.doc.error(f"tp size {tp} does not divide {key} = {value} of node '{node.name}'", path,
                               f"pick a tp size that divides {key}")


def _rank_lists(p: plan.Placement, path: Path) -> list[tuple[list[int], Path]]:
    out = [(p.ranks, path)]
    out += [(r, (*path, "walks", w)) for w, r in p.walk_ranks.items()]
    return out


def _check_ranks(ir: IR, ranks: list[int], path: Path) -> int:
    devices = ir.options.devices
    for r in ranks:
        if devices is not None and r >= devices:
            raise ir.doc.error(f"placement rank {r} out of range: {devices} device(s) give ranks 0..{devices - 1}",
                               path, "use --devices N with more devices, or a smaller rank")
    return max(ranks)


def node_ranks(node: NodeIR, walk: str) -> list[int]:
    """Ranks `node` runs on in `walk`."""
    assert node.placement is not None
    return node.placement.walk_ranks.get(walk, node.placement.ranks)


def all_ranks(node: NodeIR) -> list[int]:
    """Every rank `node` runs on in any walk, ascending."""
    assert node.placement is not None
    return sorted({*node.placement.ranks, *(r for rs in node.placement.walk_ranks.values() for r in rs)})


def _place_op(ir: IR, op: plan.Op, walk: str) -> plan.Op:
    if isinstance(op, plan.Run):
        return plan.Run(op.node, node_ranks(ir.nodes[op.node], walk))
    if isinstance(op, plan.Parallel):
        return plan.Parallel([[plan.Run(r.node, node_ranks(ir.nodes[r.node], walk)) for r in b] for b in op.branches])
    return op


def _transfers(ir: IR) -> list[plan.Transfer]:
    out: list[plan.Transfer] = []

    def add(kind: str, walk: str, s: str, sp: str, d: str, dp: str, s_ranks: list[int], d_ranks: list[int]) -> None:
        # TP groups: the lead ranks exchange; a group broadcasts inside itself.
        if set(s_ranks) != set(d_ranks) and s_ranks[0] != d_ranks[0]:
            t = plan.Transfer(kind, walk, s, sp, d, dp, s_ranks[0], d_ranks[0])
            if t not in out:
                out.append(t)

    for e in ir.edges:
        add("edge", e.walk, e.src_node, e.src_port, e.dst_node, e.dst_port,
            node_ranks(ir.nodes[e.src_node], e.walk), node_ranks(ir.nodes[e.dst_node], e.walk))
    for walk, program in ir.programs.items():
        for op in program:
            for c in getattr(op, "carries", []):
                add("carry", walk, c.src_node, c.src_port, c.dst_node, c.dst_port,
                    node_ranks(ir.nodes[c.src_node], walk), node_ranks(ir.nodes[c.dst_node], walk))
    for s in ir.streams.values():
        if s.src_node == plan.CLIENT:
            continue       # the server pushes a client-fed stream's items through the conductor
        add("stream", "", s.src_node, s.src_port, s.dst_node, s.dst_port,
            [stream_rank(ir, s.src_node)], [stream_rank(ir, s.dst_node)])
    for a, b in _walk_successions(ir):
        for name in walk_nodes(ir.walks[a]):
            node = ir.nodes[name]
            if node.has_kv_cache and name in walk_nodes(ir.walks[b]):
                add("kv", b, name, "", name, "", node_ranks(node, a), node_ranks(node, b))
    return out


def stream_rank(ir: IR, node: str) -> int:
    """Lead rank of `node` in the last walk that runs it (a decode loop, after its prefill); -1 for
    a client-fed stream's producer."""
    if node == plan.CLIENT:
        return -1
    walks = [w for w, seq in ir.walks.items() if node in walk_nodes(seq)]
    return node_ranks(ir.nodes[node], walks[-1])[0] if walks else ir.nodes[node].placement.ranks[0]


def _walk_successions(ir: IR) -> list[tuple[str, str]]:
    """(walk a, walk b) where some track may run b right after a, in table order."""
    pairs: list[tuple[str, str]] = []
    for task in ir.task_tables:
        for track in task.tracks:
            for state in track.states:
                for a in _state_walks(state):
                    for b in _next_walks(track, state, set()):
                        if (a, b) not in pairs:
                            pairs.append((a, b))
    return pairs


def _state_walks(state: plan.State) -> list[str]:
    if state.walk:
        return [state.walk]
    return [w for walks in state.for_each.values() for w in walks] if state.for_each else []


def _next_walks(track: plan.Track, state: plan.State, seen: set[int]) -> list[str]:
    out: list[str] = []
    if state.for_each:
        out += _state_walks(state)
    for t in state.transitions:
        if t.target == plan.DONE or t.target in seen:
            continue
        seen.add(t.target)
        nxt = track.states[t.target]
        out += _state_walks(nxt) if _state_walks(nxt) else _next_walks(track, nxt, seen)
    return out

