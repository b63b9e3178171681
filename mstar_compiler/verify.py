"""The IR verifier: what must hold after each pass. Tests run it between passes
(`compile_text(..., verify=True)`); a failure is a compiler bug, not a user mistake.
"""
from __future__ import annotations

from mstar_compiler import plan
from mstar_compiler.ir import IR
from mstar_compiler.passes.typecheck_loops import walk_nodes


class VerifyError(AssertionError):
    """An IR invariant does not hold after a pass."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise VerifyError(message)


def check(ir: IR, stage: str) -> None:
    """Every invariant that holds once `stage` has run."""
    for name, fn in _CHECKS:
        fn(ir)
        if name == stage:
            return


def _resolved(ir: IR) -> None:
    for node in ir.nodes.values():
        root = ir.nodes.get(node.weight_key)
        _require(root is not None and root.weight_key == root.name and root.kind == node.kind,
                 f"{node.name}: weight_key {node.weight_key} is not a root of the same kind")
        _require(node.preset in node.spec.presets, f"{node.name}: preset {node.preset} unknown")
        _require(set(node.param_args.values()) <= set(ir.params), f"{node.name}: param_args name unknown params")
    for walk in ir.walks.values():
        _require(set(walk_nodes(walk)) <= set(ir.nodes), "a walk runs an unknown node")
    _require(ir.default_task in ir.tasks, "default task unknown")


def _typechecked(ir: IR) -> None:
    for e in ir.edges:
        src = next(p for p in ir.nodes[e.src_node].outputs if p.name == e.src_port)
        dst = next(p for p in ir.nodes[e.dst_node].inputs if p.name == e.dst_port)
        _require(src.dtype == dst.dtype, f"edge {e} joins {src.dtype} to {dst.dtype}")
    streamed = {(s.dst_node, s.dst_port) for s in ir.streams.values()}
    for walk, seq in ir.walks.items():
        fed = {(e.dst_node, e.dst_port) for e in ir.edges if e.walk == walk}
        fed |= {(r.node, r.port) for r in ir.request_inputs if r.walk == walk}
        for name in walk_nodes(seq):
            for p in ir.nodes[name].inputs:
                key = (name, p.name)
                _require(p.optional or key in fed or key in streamed, f"{walk}: input {key} is fed by nothing")


def _lowered(ir: IR) -> None:
    _require(list(ir.programs) == list(ir.walks), "every walk has a program")
    for walk, program in ir.programs.items():
        for pc, op in enumerate(program):
            if isinstance(op, (plan.LoopBegin, plan.DynamicLoopBegin)):
                end = program[op.end]
                _require(isinstance(end, (plan.LoopEnd, plan.DynamicLoopEnd)) and end.begin == pc
                         and end.loop == op.loop, f"{walk}: loop at pc {pc} has no matching end")
    for task in ir.task_tables:
        for track in task.tracks:
            for state in track.states:
                _require(state.transitions and state.transitions[-1].cond.kind == "always",
                         f"{task.name}/{track.name}: state {state.index} may have no next state")
                for t in state.transitions:
                    _require(t.target == plan.DONE or 0 <= t.target < len(track.states), "transition out of range")


def _placed(ir: IR) -> None:
    for walk, program in ir.programs.items():
        for run in plan.program_runs(program):
            _require(bool(run.ranks) and all(0 <= r < ir.num_ranks for r in run.ranks),
                     f"{walk}: {run.node} placed on {run.ranks} of {ir.num_ranks} ranks")
    for t in ir.transfers:
        _require(t.src_rank != t.dst_rank, f"transfer {t} stays on one rank")


def _memory_planned(ir: IR) -> None:
    _require(len(ir.ranks) == ir.num_ranks, "one Rank per rank")
    for rank in ir.ranks:
        _require(rank.weight_bytes + rank.kv_bytes <= rank.memory_bytes, f"rank {rank.index} over budget")
    for node in ir.nodes.values():
        _require(node.has_kv_cache == bool(node.kv_pools), f"{node.name}: KV pools and has_kv_cache disagree")


def _captured(ir: IR) -> None:
    for region in ir.capture_regions:
        _require(all(ir.nodes[n].spec.is_capture_safe for n in region.nodes), "capture region with unsafe node")
        _require(region.batch_buckets == sorted(set(region.batch_buckets)), "buckets ascending")


def _buffered(ir: IR) -> None:
    for s in ir.plan_streams:
        need = s.policy.size + s.policy.context
        _require(s.capacity >= need, f"stream {s.name} buffer smaller than one chunk")


_CHECKS = [("resolve", _resolved), ("typecheck", _typechecked), ("lower", _lowered), ("place", _placed),
           ("memory", _memory_planned), ("capture", _captured), ("buffers", _buffered)]


def check_plan(built: plan.Plan, data: bytes) -> None:
    """The emitted bytes read back to the same plan."""
    _require(plan.loads_plan(data) == built, "plan.bin does not round-trip")
