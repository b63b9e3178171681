"""Pass 8, capture: CUDA-graph capture regions. A region is a loop body without inner
loops whose nodes are all capture-safe and run on one rank set in that walk; it is
captured once per batch bucket (powers of two up to the smallest max_batch of its nodes).
"""
from __future__ import annotations

from mstar_compiler import plan
from mstar_compiler.ir import IR

_BEGINS = (plan.LoopBegin, plan.DynamicLoopBegin)


def run(ir: IR) -> IR:
    for walk, program in ir.programs.items():
        for pc, op in enumerate(program):
            if isinstance(op, _BEGINS):
                region = _region(ir, walk, op, program[pc + 1:op.end])
                if region is not None:
                    ir.capture_regions.append(region)
    return ir


def _region(ir: IR, walk: str, op: plan.LoopBegin | plan.DynamicLoopBegin,
            body: list[plan.Op]) -> plan.CaptureRegion | None:
    if not all(isinstance(inner, (plan.Run, plan.Parallel)) for inner in body):
        return None      # a nested loop: not one capture region
    runs = plan.program_runs(body)
    rank_sets = {tuple(r.ranks) for r in runs}
    nodes = [ir.nodes[r.node] for r in runs]
    if len(rank_sets) != 1 or not all(n.spec.is_capture_safe for n in nodes):
        return None
    largest = min(n.max_batch for n in nodes)
    return plan.CaptureRegion(walk, op.loop, runs[0].ranks[0], [r.node for r in runs], buckets(largest))


def buckets(largest: int) -> list[int]:
    """Powers of two below `largest`, then `largest`: 1, 2, 4, ..., largest."""
    out = []
    size = 1
    while size < largest:
        out.append(size)
        size *= 2
    return [*out, largest]
