"""The walk graph as one drawable layout: what `mstarc graph` and the server's page both draw.

`layout(plan)` gives plain JSON-ready data: nodes with positions, grouped in one band per
rank (a node placed on several ranks is drawn once, in its lead rank's band, and lists all
of them); edges and loop carries (deduplicated over walks, each naming the walks it carries data
in); streaming edges with their chunk policy; the walks each task runs, per track.
Columns are dataflow layers: a node sits one column right of its rightmost producer that
is declared before it (edges back to an earlier node are drawn, not followed, so loops
and cross-walk cycles cannot break the layering). Torch-free.
"""
from __future__ import annotations

from typing import Any

from mstar_compiler import plan as P

COL_W = 260          # px between column origins
ROW_H = 96           # px between node origins inside a band
NODE_W, NODE_H = 190, 70
MARGIN = 24          # px around everything and inside each band (its label sits in the top margin)


def policy_text(policy: P.ChunkPolicy) -> str:
    """A chunk policy in a few characters: "fixed 7", "sliding 28/7", "left_context 16+4"."""
    if policy.kind == "sliding":
        return f"sliding {policy.size}/{policy.stride}"
    if policy.kind == "left_context":
        return f"left_context {policy.size}+{policy.context}"
    return f"{policy.kind} {policy.size}"


def _edges(p: P.Plan) -> list[dict[str, Any]]:
    out: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for e in p.edges:
        key = (e.src_node, e.src_port, e.dst_node, e.dst_port)
        entry = out.setdefault(key, {"src": e.src_node, "src_port": e.src_port, "dst": e.dst_node,
                                     "dst_port": e.dst_port, "walks": []})
        if e.walk not in entry["walks"]:
            entry["walks"].append(e.walk)
    return list(out.values())


def _carries(p: P.Plan) -> list[dict[str, Any]]:
    out: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for w in p.walks:
        for op in w.program:
            for c in getattr(op, "carries", []):
                entry = out.setdefault((c.src_node, c.src_port, c.dst_node, c.dst_port), {
                    "src": c.src_node, "src_port": c.src_port, "dst": c.dst_node, "dst_port": c.dst_port, "walks": []})
                if w.name not in entry["walks"]:
                    entry["walks"].append(w.name)
    return list(out.values())


def _streams(p: P.Plan) -> list[dict[str, Any]]:
    return [{"name": s.name, "src": s.src_node, "src_port": s.src_port, "dst": s.dst_node, "dst_port": s.dst_port,
             "policy": policy_text(s.policy), "policy_kind": s.policy.kind, "capacity": s.capacity,
             "src_rank": s.src_rank, "dst_rank": s.dst_rank} for s in p.streams]


def _task_walks(t: P.Task) -> list[dict[str, Any]]:
    tracks = []
    for track in t.tracks:
        walks: list[str] = []
        for s in track.states:
            for w in ([s.walk] if s.walk else []) + [w for ws in (s.for_each or {}).values() for w in ws]:
                if w not in walks:
                    walks.append(w)
        tracks.append({"name": track.name, "walks": walks, "per_chunk": track.per_chunk})
    return tracks


def _columns(p: P.Plan, links: list[tuple[str, str]]) -> dict[str, int]:
    """Dataflow layer of every node, following only links from an earlier-declared node."""
    order = {n.name: i for i, n in enumerate(p.nodes)}
    col = {n.name: 0 for n in p.nodes}
    for n in p.nodes:
        for src, dst in links:
            if dst == n.name and order[src] < order[dst]:
                col[dst] = max(col[dst], col[src] + 1)
    return col


def _place(p: P.Plan, col: dict[str, int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int, int]:
    """Node boxes and rank bands: bands stacked top to bottom, nodes of one column stacked in a band."""
    nodes, bands, top, num_cols = [], [], MARGIN, max(col.values(), default=0) + 1
    for r in p.ranks:
        mine = [n for n in p.nodes if n.placement.ranks[0] == r.index]
        slots: dict[int, int] = {}
        for n in mine:
            row = slots[col[n.name]] = slots.get(col[n.name], -1) + 1
            nodes.append({"name": n.name, "kind": n.kind, "rank": r.index, "ranks": list(n.placement.ranks),
                          "tp_size": n.placement.tp_size, "has_kv_cache": n.has_kv_cache, "max_batch": n.max_batch,
                          "x": 2 * MARGIN + col[n.name] * COL_W, "y": top + MARGIN + row * ROW_H,
                          "w": NODE_W, "h": NODE_H})
        rows = max(slots.values(), default=-1) + 1
        height = 2 * MARGIN + max(rows, 1) * ROW_H - (ROW_H - NODE_H)
        bands.append({"index": r.index, "nodes": [n.name for n in mine], "x": MARGIN, "y": top,
                      "w": 2 * MARGIN + (num_cols - 1) * COL_W + NODE_W, "h": height})
        top += height + MARGIN
    return nodes, bands, 3 * MARGIN + (num_cols - 1) * COL_W + NODE_W + MARGIN, top


def layout(p: P.Plan) -> dict[str, Any]:
    """Everything needed to draw the plan's walk graph (JSON-ready; `mstarc graph --format json`)."""
    edges, streams = _edges(p), _streams(p)
    col = _columns(p, [(e["src"], e["dst"]) for e in edges] +
                   [(s["src"], s["dst"]) for s in streams if s["src"] != P.CLIENT])   # the client has no box
    nodes, ranks, width, height = _place(p, col)
    return {"model": p.model, "preset": p.preset, "placement": p.placement, "width": width, "height": height,
            "ranks": ranks, "nodes": nodes, "edges": edges, "carries": _carries(p), "streams": streams,
            "walks": [{"name": w.name, "nodes": list(w.nodes)} for w in p.walks],
            "tasks": [{"name": t.name, "tracks": _task_walks(t)} for t in p.tasks],
            "default_task": p.default_task}
