"""Pass 9, buffers: per streaming edge, its chunk policy and the per-request buffer
capacity on the consuming rank.

Capacity is what the consumer must keep plus what the producer may add while one chunk
is being consumed: fixed K -> 2K; sliding (W, S) -> W + S; left_context (C, L) -> L + 2C.
"""
from __future__ import annotations

from mstar_compiler import plan
from mstar_compiler.ir import IR
from mstar_compiler.passes.place import stream_rank


def capacity(policy: plan.ChunkPolicy) -> int:
    """Items a consumer-side buffer holds per request for `policy`."""
    if policy.kind == "fixed":
        return 2 * policy.size
    if policy.kind == "sliding":
        return policy.size + policy.stride
    return policy.context + 2 * policy.size


def run(ir: IR) -> IR:
    for s in ir.streams.values():
        ir.plan_streams.append(plan.Stream(s.name, s.src_node, s.src_port, s.dst_node, s.dst_port, s.policy,
                                           capacity(s.policy), stream_rank(ir, s.src_node),
                                           stream_rank(ir, s.dst_node)))
    return ir

