"""What each Run of a BAGEL node means, read once from the plan (no walk names hard-coded).

A `bagel_mot_lm` node runs one kind of segment per walk, decided by where its inputs come
from in that walk: a loop-carried latent is a generation step (GEN), a loop-carried token
a decode step (DECODE), an `embeds` edge a ViT block (VIT), a `latent` edge a clean VAE
block (VAE), anything else prompt text (TEXT). Its CFG role is the `cfg_combine` input
its velocity feeds: `v_full` -> "full", `v_text` -> "cfg_text" (BAGEL's text-dropped
context), `v_img` -> "cfg_img" (image-dropped).
"""
from __future__ import annotations

from mstar_compiler.plan import DynamicLoopBegin, LoopBegin, Node, Plan
from runtime.models.bagel.segments import SegmentKind

ROLE_OF_PORT = {"v_full": "full", "v_text": "cfg_text", "v_img": "cfg_img"}


def _carried_ports(plan: Plan, walk: str, node: str) -> set[str]:
    return {c.dst_port for op in plan.walk(walk).program if isinstance(op, (LoopBegin, DynamicLoopBegin))
            for c in op.carries if c.dst_node == node}


def segment_kinds(plan: Plan, node: str) -> dict[str, SegmentKind]:
    """walk name -> the kind of segment `node` runs in it."""
    kinds = {}
    for walk in plan.walks:
        if node not in walk.nodes:
            continue
        carried = _carried_ports(plan, walk.name, node)
        edged = {e.dst_port for e in plan.edges if e.walk == walk.name and e.dst_node == node}
        if "latent" in carried:
            kinds[walk.name] = SegmentKind.GEN
        elif "tokens" in carried:
            kinds[walk.name] = SegmentKind.DECODE
        elif "embeds" in edged:
            kinds[walk.name] = SegmentKind.VIT
        elif "latent" in edged:
            kinds[walk.name] = SegmentKind.VAE
        else:
            kinds[walk.name] = SegmentKind.TEXT
    return kinds


def cfg_consumer(plan: Plan, node: str) -> tuple[Node | None, str]:
    """(the cfg_combine node fed by `node`'s velocity, its CFG role); (None, "full") if none."""
    for e in plan.edges:
        if e.src_node == node and e.src_port == "velocity" and plan.node(e.dst_node).kind == "cfg_combine":
            return plan.node(e.dst_node), ROLE_OF_PORT.get(e.dst_port, "full")
    return None, "full"

